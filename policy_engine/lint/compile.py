"""Compile policies for the lint with each file parsed once and each CEL condition compiled once.

The lint runs the compiler's own stage table (:data:`policy_engine.compiler.STAGES`) up to
CheckTypes, so rules see exactly what the compiler sees. Only two stages are replaced, both by
cached equivalents: ResolveImports (parses come from a cache keyed by real path, so a library
imported by a thousand policies is parsed once) and CompileConditions (keyed by the condition's
text and position). The result-building stages (builtins, hash, indices) are not needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from policy_engine.compiler import STAGES
from policy_engine.compiler.context import CompileContext, Unit
from policy_engine.dsl import ast
from policy_engine.dsl.cel import CelCondition, compile_condition
from policy_engine.dsl.fastparse import parse_file
from policy_engine.errors import Diagnostic, Span

_ALWAYS = "true"


@dataclass(slots=True)
class Parsed:
    file: ast.PolicyFile | None
    diagnostics: list[Diagnostic]


@dataclass(slots=True)
class Caches:
    """Parses by real path and compiled conditions by (text, position), for one process."""

    parses: dict[str, Parsed] = field(default_factory=dict)
    conditions: dict[tuple[str, Span], CelCondition | list[Diagnostic]] = field(
        default_factory=dict)

    def parse(self, real: str, shown: str) -> Parsed:
        hit = self.parses.get(real)
        if hit is None:
            pf, diags = parse_file(real, display=shown)
            hit = self.parses[real] = Parsed(pf, diags)
        return hit

    def condition(self, source: str, span: Span) -> CelCondition | list[Diagnostic]:
        key = (source, span)
        hit = self.conditions.get(key)
        if hit is None:
            hit = self.conditions[key] = compile_condition(source, span)
        return hit


def is_manifest_file(pf: ast.PolicyFile) -> bool:
    """A header-less file holding only tool blocks: a manifest (``load_manifest`` reads it)."""
    return bool(pf.items) and all(isinstance(i, ast.ToolDef) for i in pf.items)


def compile_policy(real: str, shown: str, caches: Caches, home: str) -> CompileContext:
    """The compile context of the policy rooted at ``real`` (stages up to CheckTypes)."""
    root = caches.parse(real, shown)
    require_header = not (root.file is not None and not root.file.headers
                          and is_manifest_file(root.file))
    ctx = CompileContext(paths=(shown,), home=home, require_header=require_header)
    _resolve(ctx, caches, real, shown)
    for name, stage, needs_clean in STAGES:
        if needs_clean:
            break
        if name == "ResolveImports":
            continue
        if name == "CompileConditions":
            _compile_conditions(ctx, caches)
            continue
        stage(ctx)
    return ctx


def _resolve(ctx: CompileContext, caches: Caches, real: str, shown: str) -> None:
    """ResolveImports with the parse cache: same order, same SBP203/SBP204 diagnostics."""
    base_dir = os.path.dirname(real)
    done: set[str] = set()
    stack: list[tuple[str, str]] = []

    def visit(real: str, shown: str, via: ast.Import | None) -> None:
        chain = [r for r, _ in stack]
        if real in chain:
            cycle = [s for _, s in stack[chain.index(real):]] + [shown]
            span = via.path.span if via is not None else Span(shown, 1, 1)
            ctx.report("SBP203", "import cycle: " + " -> ".join(f"`{c}`" for c in cycle), span)
            return
        if real in done:
            return
        if via is not None and not os.path.isfile(real):
            ctx.report("SBP204", f"cannot find imported file `{via.path.value}` (looked for "
                       f"`{shown}`)", via.path.span)
            done.add(real)
            return
        parsed = caches.parse(real, shown)
        ctx.diagnostics.extend(parsed.diagnostics)
        done.add(real)
        pf = parsed.file
        if pf is None:
            return
        stack.append((real, shown))
        here_real, here_shown = os.path.dirname(real), os.path.dirname(shown)
        for imp in pf.imports:
            target = imp.path.value
            if not target:
                ctx.report("SBP204", "empty import path", imp.path.span)
                continue
            visit(os.path.realpath(os.path.join(here_real, target)),
                  os.path.normpath(os.path.join(here_shown, target)), imp)
        stack.pop()
        rel = os.path.relpath(real, base_dir).replace(os.sep, "/")
        ctx.units.append(Unit(pf, rel, via is None))

    visit(real, shown, None)


def _compile_conditions(ctx: CompileContext, caches: Caches) -> None:
    """CompileConditions with the condition cache (same diagnostics, compiled once)."""
    for draft in ctx.rules:
        node = next((c for c in draft.node.clauses if isinstance(c, ast.Cel)), None)
        if node is not None:
            draft.condition = _take(ctx, caches.condition(node.source, node.span))
    for consent in ctx.consents:
        cond = consent.node.condition
        if cond is not None:
            consent.condition = _take(ctx, caches.condition(cond.source, cond.span))
        else:
            consent.condition = _take(ctx, caches.condition(_ALWAYS, consent.node.span))


def _take(ctx: CompileContext, result: CelCondition | list[Diagnostic]) -> CelCondition | None:
    if isinstance(result, list):
        ctx.diagnostics.extend(result)
        return None
    return result
