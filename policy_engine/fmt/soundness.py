"""Prove a formatting means what the original meant (Cedar's ``soundness_check``).

Two levels, both independent of source positions (lines and columns legitimately move):

1. **AST**: the output is reparsed with the official Lark parser and must give the same AST
   as the input, spans left out and each CEL condition compared by :func:`layout.cel_key`.
   This holds for every file, including fragments that only compile as part of another.
2. **Decision graph**: when the original compiles on its own (its imports read from disk, no
   header required), the output must compile too, to the same :func:`fingerprint`: every
   rule in order with its effect, capabilities, limits and condition, the indices by kind,
   consent rules, defaults, profiles and tool manifests. Unnamed rules are named after their
   line (``org:12``), so their ids are left out; their order is compared instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from policy_engine.compiler.context import CompileContext, Unit
from policy_engine.compiler.imports import resolve_imports
from policy_engine.compiler.pipeline import STAGES
from policy_engine.dsl import ast
from policy_engine.dsl.parser import parse_source
from policy_engine.errors import Diagnostic, Severity, Span
from policy_engine.fmt.layout import cel_key
from policy_engine.graph import PolicySet

_HOME = "/home/fmt-soundness"
"""``~`` for both compilations: any fixed value, the two sides only need to agree."""


def check(original: ast.PolicyFile, formatted: str, real_path: str | None) -> Diagnostic | None:
    """``None`` when ``formatted`` means the same as ``original``, else the SBP420 diagnostic;
    the note SBP422 when the AST proves it but check errors of the file's own leave no decision
    graph to compare (the output is sound and may be written).

    :param real_path: where the file lives, to resolve its imports (``None``: the current
        directory, for standard input).
    """
    file = original.file
    reparsed, diags = parse_source(formatted, file)
    if diags:
        first = diags[0]
        where = f" (line {first.span.line})" if first.span else ""
        return _problem(file, f"its output does not parse: {first.id} {first.message}{where}")
    before, after = ast_shape(original), ast_shape(reparsed)
    if before != after:
        return _problem(file, f"the parsed policy differs: {_first_difference(before, after)}")
    base = os.path.dirname(os.path.realpath(real_path)) if real_path else os.getcwd()
    compiled = compile_in_memory(original, base)
    if isinstance(compiled, list):
        own = [d for d in compiled if d.span is not None and d.span.file == file
               and d.id not in CONTEXT_ERRORS]
        if own:  # wrong whatever imports it: say that the AST alone was the proof
            return _own_error(file, own[0])
        return None  # a fragment (names from its importer): the AST comparison is the proof
    again = compile_in_memory(reparsed, base)
    if not isinstance(again, str):
        return _problem(file, "its output no longer compiles")
    if compiled != again:
        return _problem(file, "the compiled decision graph differs")
    return None


CONTEXT_ERRORS = frozenset({"SBP200", "SBP201", "SBP202", "SBP203", "SBP204", "SBP215"})
"""Errors a file compiled alone may show only because it is a fragment of a larger policy (a
name its importer defines, a header it does not need): no note for those."""


def _own_error(file: str, first: Diagnostic) -> Diagnostic:
    where = f":{first.span.line}:{first.span.column}" if first.span else ""
    return Diagnostic.make(
        "SBP422", f"`{file}` does not compile ({first.id} at {file}{where}: {first.message}): "
        "its layout was proven by the syntax tree only, there is no decision graph to compare",
        Span(file, 0, 0))


def _problem(file: str, why: str) -> Diagnostic:
    return Diagnostic.make("SBP420", f"refusing to format `{file}`: {why}", Span(file, 0, 0))


def ast_shape(node: Any) -> Any:
    """A position-free rendering of an AST node: nested tuples, spans and comments left out."""
    if isinstance(node, ast.Cel):
        return ("Cel", cel_key(node.source))
    if isinstance(node, ast.PolicyFile):
        return ("PolicyFile", ast_shape(node.items))
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return (type(node).__name__, *(
            (f.name, ast_shape(getattr(node, f.name)))
            for f in dataclasses.fields(node) if f.name != "span"))
    if isinstance(node, list | tuple):
        return tuple(ast_shape(x) for x in node)
    return node


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                label = x[0] if isinstance(x, tuple) and x and isinstance(x[0], str) else str(i)
                return _first_difference(x, y, f"{path}/{label}")
    return f"at {path or '/'}: {str(a)[:120]} became {str(b)[:120]}"


def compile_in_memory(pf: ast.PolicyFile, base_dir: str) -> str | list[Diagnostic]:
    """The fingerprint of ``pf`` compiled as a root file (its imports read from ``base_dir``),
    or the errors if it has any."""
    targets = [os.path.join(base_dir, i.path.value) for i in pf.imports if i.path.value]
    ctx = CompileContext(paths=tuple(targets), home=_HOME, require_header=False)
    resolve_imports(ctx)
    for unit in ctx.units:
        unit.root = False  # imported, as they would be from the file on disk
    ctx.units.append(Unit(pf, os.path.basename(pf.file), root=True))
    for _name, stage, needs_clean in STAGES[1:]:  # ResolveImports done above
        if needs_clean and ctx.has_errors:
            break
        stage(ctx)
    if ctx.has_errors or ctx.result is None:
        return [d for d in ctx.diagnostics if d.severity is Severity.ERROR]
    anonymous = {d.id for d in ctx.rules if d.node.name is None}
    return fingerprint(ctx.result, anonymous)


def fingerprint(ps: PolicySet, anonymous: set[str] | frozenset[str] = frozenset()) -> str:
    """SHA-256 over what a PolicySet decides, without any source position.

    :param anonymous: ids derived from a line number (rules without a name): left out.
    """
    index = {id(r): i for i, r in enumerate(ps.rules)}
    doc = {
        "name": ps.name,
        "version": ps.version,
        "defaults": ps.defaults.model_dump(mode="json", exclude_none=True),
        "network": ps.network.value,
        "rules": [{
            "id": None if r.id in anonymous else r.id,
            "effect": r.effect,
            "mandatory": r.mandatory,
            "capabilities": {k.value: c.model_dump(mode="json", by_alias=True)
                             for k, c in r.capabilities.items()},
            "limits": r.limits.model_dump(mode="json", exclude_none=True) if r.limits else None,
            "condition": cel_key(r.condition.source) if r.condition else None,
        } for r in ps.rules],
        "permits": {k.value: [index[id(r)] for r in v] for k, v in ps.permits_by_kind.items()},
        "forbids": {k.value: [index[id(r)] for r in v] for k, v in ps.forbids_by_kind.items()},
        "consent": [cel_key(c.condition.source) if c.condition else None
                    for c in ps.consent_rules],
        "profiles": {n: {"network": p.network.value if p.network else None,
                         "fs_mode": p.fs_mode,
                         "writable": list(p.writable) if p.writable is not None else None,
                         "limits": p.limits.model_dump(mode="json", exclude_none=True),
                         "isolation": p.isolation.value if p.isolation else None}
                     for n, p in sorted(ps.profiles.items())},
        "tools": {n: m.model_dump(mode="json", by_alias=True)
                  for n, m in sorted(ps.tools.items())},
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
