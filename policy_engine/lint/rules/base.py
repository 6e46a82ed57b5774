"""What every rule module shares: the emit helper and views of a file's rules and resources."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from policy_engine.compiler.context import RuleDraft
from policy_engine.compiler.resources import build_capabilities
from policy_engine.dsl import ast
from policy_engine.errors import Diagnostic, Span
from policy_engine.lint.model import FileView, Finding, LintConfig
from policy_engine.model import Capability, CapabilityKind

Check = Callable[[FileView, LintConfig], Iterable[Finding]]
"""A rule's check: every finding of one rule family in one file."""


def finding(rule_id: str, message: str, span: Span, anchor: Span | int,
            *, help: str | None = None) -> Finding:
    """A finding at ``span`` inside the statement starting at ``anchor`` (a span or a line)."""
    line = anchor if isinstance(anchor, int) else anchor.line
    return Finding(Diagnostic.make(rule_id, message, span, help=help), anchor_line=line)


def head(rule: ast.Rule) -> Span:
    """The span of a rule's head (``permit "name" kind, kind``): where its findings point."""
    last = rule.kinds[-1].span if rule.kinds else (rule.name.span if rule.name else rule.span)
    end_line = last.end_line or last.line
    end_col = last.end_column or last.column
    return Span(rule.span.file, rule.span.line, rule.span.column, end_line, end_col)


def label(rule: ast.Rule, draft_id: str | None = None) -> str:
    if rule.name is not None:
        return f"`{rule.name.value}`"
    return f"`{draft_id}`" if draft_id else f"at line {rule.span.line}"


def drafts(view: FileView) -> list[RuleDraft]:
    """The top-level rule drafts of this file, in source order."""
    return [d for d in view.policy.rules if d.unit.file is view.file]


@dataclass(frozen=True, slots=True)
class RuleView:
    """A permit/forbid with its capabilities: a top-level rule or a tool block's permit.

    :param anchor: the statement a suppression above covers (the tool block for its permits).
    """

    node: ast.Rule
    capabilities: dict[CapabilityKind, Capability]
    anchor: Span
    tool_block: str | None = None
    draft: RuleDraft | None = None

    def resources(self, name: str) -> Iterator[ast.Value]:
        for clause in self.node.clauses:
            if isinstance(clause, ast.Resource) and clause.name == name:
                yield from clause.values

    def resource(self, name: str) -> ast.Resource | None:
        return next((c for c in self.node.clauses
                     if isinstance(c, ast.Resource) and c.name == name), None)

    def tool(self) -> ast.ToolClause | None:
        return next((c for c in self.node.clauses if isinstance(c, ast.ToolClause)), None)


def rule_views(view: FileView, *, tool_blocks: bool = True) -> list[RuleView]:
    """Top-level rules (capabilities from the compiler's drafts), then tool-block permits."""
    out = [RuleView(d.node, d.capabilities, d.node.span, None, d) for d in drafts(view)]
    if tool_blocks:
        for item in view.file.items:
            if isinstance(item, ast.ToolDef):
                for permit in item.permits:
                    caps = build_capabilities(permit, [])
                    out.append(RuleView(permit, caps, item.span, item.name.value))
    return out


def where(rv: RuleView) -> str:
    """How a message names the rule: ``rule `x``` or ``tool `t` permit``."""
    if rv.tool_block is not None:
        return f"permit of tool `{rv.tool_block}`"
    return f"rule {label(rv.node, rv.draft.id if rv.draft else None)}"


def unconditional(rule: ast.Rule) -> bool:
    """Whether the rule has no `when` (it applies to every call its resources match)."""
    return not any(isinstance(c, ast.Cel) for c in rule.clauses)
