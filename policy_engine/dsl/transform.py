"""Turn the Lark parse tree of one file into AST dataclasses with a span on every node."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from lark import Token, Tree

from policy_engine.dsl import ast
from policy_engine.dsl.escapes import is_surrogate_escape, unescape
from policy_engine.dsl.grammar import grammar_text
from policy_engine.errors import Diagnostic, Span

# The parser keeps every token (`keep_all_tokens`) and computes no positions of its own: both are
# cheaper done here in one pass (they were half the parse time). Node methods see only the tokens
# of terminals the grammar names; anonymous keywords and punctuation (`policy`, `{`, `[`) only
# widen the node's span, exactly as Lark's `propagate_positions` would.
_NAMED_TERMINALS = frozenset(
    re.findall(r"^([A-Z][A-Z0-9_]*)(?:\.\d+)?\s*:", grammar_text(), re.MULTILINE)
)

_Position = tuple[int, int]


class ToAst:
    """Bottom-up conversion; string escapes it cannot decode become SBP104 diagnostics."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.diagnostics: list[Diagnostic] = []
        self._methods: dict[str, Callable[[Span, list[Any]], Any]] = {}

    def transform(self, tree: Tree[Token]) -> list[ast.Item]:
        items: list[ast.Item] = self._walk(tree)[0]
        return items

    def _walk(self, tree: Tree[Token]) -> tuple[Any, _Position | None, _Position | None]:
        kept: list[Any] = []
        first: _Position | None = None
        last: _Position | None = None
        for child in tree.children:
            if isinstance(child, Token):
                if first is None:
                    first = (child.line or 1, child.column or 1)
                last = (child.end_line or 1, child.end_column or 1)
                if child.type in _NAMED_TERMINALS:
                    kept.append(child)
            else:
                value, child_first, child_last = self._walk(child)
                if child_first is not None:
                    first = first or child_first
                    last = child_last
                kept.append(value)
        if first is None or last is None:
            span = Span(self.file, 1, 1)
        else:
            span = Span(self.file, first[0], first[1], last[0], last[1])
        method = self._methods.get(tree.data)
        if method is None:
            method = self._methods[tree.data] = getattr(self, str(tree.data))
        return method(span, kept), first, last

    # ---- helpers ---------------------------------------------------------------------------

    def _tspan(self, tok: Token) -> Span:
        return Span(self.file, tok.line or 1, tok.column or 1, tok.end_line, tok.end_column)

    def _str(self, tok: Token) -> ast.Str:
        return ast.Str(self._unescape(tok), self._tspan(tok))

    def _unescape(self, tok: Token) -> str:
        text, bad = unescape(str(tok)[1:-1])
        for offset, esc in bad:
            col = (tok.column or 1) + 1 + offset
            if is_surrogate_escape(esc):
                self.diagnostics.append(Diagnostic.make(
                    "SBP104", f"`\\{esc}` is a lone UTF-16 surrogate, not a character",
                    Span(self.file, tok.line or 1, col),
                    help="write the character itself, or a high+low pair (\\uD83D\\uDE00); "
                         "\\uD800-\\uDFFF alone cannot be encoded",
                ))
                continue
            self.diagnostics.append(Diagnostic.make(
                "SBP104", f"invalid escape `\\{esc}` in string literal",
                Span(self.file, tok.line or 1, col),
                help="escapes: \\\" \\\\ \\n \\t \\r \\/ \\0 \\uXXXX",
            ))
        return text

    def _value(self, tok: Token) -> ast.Value:
        if tok.type == "STRING":
            return self._str(tok)
        if tok.type == "QUANTITY":
            return ast.Quantity(str(tok), self._tspan(tok))
        return ast.Word(str(tok), self._tspan(tok))

    # ---- top level -------------------------------------------------------------------------

    def start(self, span: Span, items: list[ast.Item]) -> list[ast.Item]:
        return items

    def header(self, span: Span, c: list[Token]) -> ast.Header:
        return ast.Header(self._str(c[0]), self._str(c[1]), span)

    def import_(self, span: Span, c: list[Token]) -> ast.Import:
        return ast.Import(self._str(c[0]), span)

    def defaults(self, span: Span, c: list[Any]) -> ast.Defaults:
        settings = tuple(x for x in c if isinstance(x, ast.Setting))
        limits = tuple(x for x in c if isinstance(x, ast.LimitsBlock))
        return ast.Defaults(settings, limits, span)

    def timeout(self, span: Span, c: list[Token]) -> ast.Setting:
        return ast.Setting("timeout", self._value(c[0]), span)

    def network(self, span: Span, c: list[Token]) -> ast.Setting:
        return ast.Setting("network", self._value(c[0]), span)

    def limits(self, span: Span, c: list[ast.Limit]) -> ast.LimitsBlock:
        return ast.LimitsBlock(tuple(c), span)

    def limit(self, span: Span, c: list[Token]) -> ast.Limit:
        return ast.Limit(
            ast.Word(str(c[0]), self._tspan(c[0])),
            ast.Quantity(str(c[1]), self._tspan(c[1])),
            span,
        )

    # ---- rules -----------------------------------------------------------------------------

    def rule(self, span: Span, c: list[Any]) -> ast.Rule:
        return self._rule(span, c)

    def tool_permit(self, span: Span, c: list[Any]) -> ast.Rule:
        return self._rule(span, c)

    def _rule(self, span: Span, c: list[Any]) -> ast.Rule:
        effect_tok: Token = c[0]
        rest = c[1:]
        mandatory = False
        name: ast.Str | None = None
        if rest and isinstance(rest[0], Token) and rest[0].type == "MANDATORY":
            mandatory = True
            rest = rest[1:]
        if rest and isinstance(rest[0], Token) and rest[0].type == "STRING":
            name = self._str(rest[0])
            rest = rest[1:]
        kinds: tuple[ast.Word, ...] = rest[0]
        effect: Literal["permit", "forbid"] = (
            "permit" if str(effect_tok) == "permit" else "forbid")
        return ast.Rule(effect, mandatory, name, kinds, tuple(rest[1:]), span)

    def effect(self, span: Span, c: list[Token]) -> Token:
        return c[0]

    def kinds(self, span: Span, c: list[Token]) -> tuple[ast.Word, ...]:
        return tuple(ast.Word(str(t), self._tspan(t)) for t in c)

    def resource(self, span: Span, c: list[Any]) -> ast.Resource:
        return ast.Resource(str(c[0]), c[1], span)

    def values(self, span: Span, c: list[Token]) -> tuple[ast.Value, ...]:
        return tuple(self._value(t) for t in c)

    def tool_clause(self, span: Span, c: list[Any]) -> ast.ToolClause:
        args = c[2] if len(c) > 2 else None
        return ast.ToolClause(self._str(c[1]), args, span)

    def args(self, span: Span, c: list[ast.ArgSlotNode]) -> tuple[ast.ArgSlotNode, ...]:
        return tuple(c)

    def slot(self, span: Span, c: list[Token]) -> ast.ArgSlotNode:
        repeat = bool(c) and c[-1].type == "ELLIPSIS"
        alts = [self._alt(tok) for tok in (c[:-1] if repeat else c)]
        return ast.ArgSlotNode(tuple(alts), repeat, span)

    def _alt(self, tok: Token) -> ast.ArgAlt:
        if tok.type == "REGEX":
            return ast.ArgAlt(None, str(tok)[1:-1].replace("\\/", "/"), self._tspan(tok))
        return ast.ArgAlt(self._unescape(tok), None, self._tspan(tok))

    def env(self, span: Span, c: list[Token]) -> ast.EnvClause:
        return ast.EnvClause(tuple(self._alt(tok) for tok in c[1:]), span)

    def scalar(self, span: Span, c: list[Token]) -> ast.Scalar:
        return ast.Scalar(str(c[0]), self._value(c[1]), span)

    def when(self, span: Span, c: list[Token]) -> ast.Cel:
        return ast.Cel(str(c[0])[1:-1], self._tspan(c[0]))

    def consent(self, span: Span, c: list[Token]) -> ast.Consent:
        cond = ast.Cel(str(c[0])[1:-1], self._tspan(c[0])) if c else None
        return ast.Consent(cond, span)

    # ---- profiles and tools ----------------------------------------------------------------

    def profile(self, span: Span, c: list[Any]) -> ast.ProfileDef:
        settings = tuple(x for x in c[1:] if isinstance(x, ast.Setting | ast.ListSetting))
        limits = tuple(x for x in c[1:] if isinstance(x, ast.LimitsBlock))
        return ast.ProfileDef(self._str(c[0]), settings, limits, span)

    def fs_mode(self, span: Span, c: list[Token]) -> ast.Setting:
        return ast.Setting("fs", self._value(c[0]), span)

    def isolation(self, span: Span, c: list[Token]) -> ast.Setting:
        return ast.Setting("isolation", self._value(c[0]), span)

    def writable(self, span: Span, c: list[Any]) -> ast.ListSetting:
        return ast.ListSetting("writable", c[0], span)

    def tool(self, span: Span, c: list[Any]) -> ast.ToolDef:
        body = c[3:]
        return ast.ToolDef(
            self._str(c[1]), self._str(c[2]),
            tuple(x for x in body if isinstance(x, ast.Rule)),
            tuple(x for x in body if isinstance(x, ast.Setting | ast.ListSetting)),
            tuple(x for x in body if isinstance(x, ast.LimitsBlock)),
            span,
        )

    def description(self, span: Span, c: list[Token]) -> ast.Setting:
        return ast.Setting("description", self._str(c[0]), span)

    def side_effects(self, span: Span, c: list[Any]) -> ast.ListSetting:
        return ast.ListSetting("side_effects", c[0], span)

    def safety(self, span: Span, c: list[Token]) -> ast.Setting:
        return ast.Setting("safety", self._value(c[0]), span)

    def tool_profile(self, span: Span, c: list[Token]) -> ast.Setting:
        return ast.Setting("profile", self._str(c[0]), span)
