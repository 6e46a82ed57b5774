"""Compile policies for the lint with each file parsed once and each CEL condition compiled once.

The lint runs the compiler's own stage table (:data:`policy_engine.compiler.STAGES`) up to
CheckTypes, so rules see exactly what the compiler sees. The context is given cached readers:
files come from a cache keyed by real path (a library imported by a thousand policies is
parsed once, by the fast reader) and conditions from one keyed by text and position. The
result-building stages (builtins, hash, indices) are not needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policy_engine.compiler import STAGES
from policy_engine.compiler.context import CompileContext
from policy_engine.dsl import ast
from policy_engine.dsl.cel import CelCondition, compile_condition
from policy_engine.dsl.fastparse import parse_file
from policy_engine.errors import Diagnostic, Span


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

    def read(self, real: str, shown: str) -> tuple[ast.PolicyFile | None, list[Diagnostic]]:
        """The compiler's ``read_policy``: a parse from the cache."""
        parsed = self.parse(real, shown)
        return parsed.file, parsed.diagnostics

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
    ctx = CompileContext(paths=(shown,), home=home, require_header=require_header,
                         read_policy=caches.read, compile_cel=caches.condition)
    for _name, stage, needs_clean in STAGES:
        if needs_clean:
            break
        stage(ctx)
    return ctx
