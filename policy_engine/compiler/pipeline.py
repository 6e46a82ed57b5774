"""The compiler: an ordered table of named stages over a CompileContext, and its entry points.

Like OPA's ``compile.go``, each stage is a named function of the context; the table's order is
the only control flow. Ordering constraints (each stage may rely on the ones above it):

- ResolveImports first: every other stage reads ``ctx.units``.
- CheckHeaders before anything that reports per-policy facts (needs the set's name/version).
- CheckDuplicates creates the rule and consent drafts (with ids) the later stages fill in.
- ResolveNames needs the profile names of all units (and the built-in names), so it follows
  ResolveImports; it does not need CheckBlocks.
- ValidateResources and CheckBlocks build capabilities, limits, profiles and manifests with
  ``~`` unexpanded.
- CheckShadowed after ValidateResources (reads the rules' fs capabilities; warnings only).
- CompileConditions before CheckTypes: types are read from the compiled conditions.
- AddBuiltins after CheckBlocks (a policy may redefine a seed profile) and before
  ComputeVersionHash (built-ins are part of the version).
- ComputeVersionHash before ExpandHome, so the hash does not depend on the user's home.
- ExpandHome, then BuildRuleIndices last: it assembles the PolicySet from the final drafts.
The last four stages run only when no error was found: they build the result.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from policy_engine.compiler.blocks import check_blocks
from policy_engine.compiler.build import (
    build_rule_indices,
    compute_version_hash,
    expand_home_stage,
)
from policy_engine.compiler.builtins import add_builtins
from policy_engine.compiler.checks import (
    check_duplicates,
    check_headers,
    check_shadowed,
    resolve_names,
)
from policy_engine.compiler.conditions import check_types, compile_conditions
from policy_engine.compiler.context import CompileContext
from policy_engine.compiler.imports import resolve_imports
from policy_engine.compiler.resources import validate_resources
from policy_engine.errors import Diagnostic, DiagnosticsError, Severity
from policy_engine.graph import PolicySet

Stage = Callable[[CompileContext], None]

STAGES: tuple[tuple[str, Stage, bool], ...] = (
    # (name, stage, runs only if no error so far)
    ("ResolveImports", resolve_imports, False),
    ("CheckHeaders", check_headers, False),
    ("CheckDuplicates", check_duplicates, False),
    ("ResolveNames", resolve_names, False),
    ("ValidateResources", validate_resources, False),
    ("CheckBlocks", check_blocks, False),
    ("CheckShadowed", check_shadowed, False),
    ("CompileConditions", compile_conditions, False),
    ("CheckTypes", check_types, False),
    ("AddBuiltins", add_builtins, True),
    ("ComputeVersionHash", compute_version_hash, True),
    ("ExpandHome", expand_home_stage, True),
    ("BuildRuleIndices", build_rule_indices, True),
)


def run_stages(
    paths: Sequence[str | os.PathLike[str]], *, home: str | None = None,
    require_header: bool = True,
) -> CompileContext:
    """Run every stage in order and return the context (diagnostics and, if clean, result)."""
    ctx = CompileContext(
        paths=tuple(paths),
        home=home if home is not None else os.path.expanduser("~"),
        require_header=require_header,
    )
    if not ctx.paths:
        ctx.report("SBP100", "no policy files given", None, help="pass one or more .sbpolicy files")
    with collector_paused():
        for _name, stage, needs_clean in STAGES:
            if needs_clean and ctx.has_errors:
                break
            stage(ctx)
    ctx.diagnostics.sort(key=_order)
    return ctx


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the stages run, back on after (only if it
    was on). A compile allocates tens of thousands of objects that live on in the policy set,
    and every collection during it rescans all of them: ≈ 40 % of a 10,000-rule compile
    (docs/benchmarks.md). What one compile can allocate is bounded by the input limits
    (docs/operations.md "Input limits"); reference counting still frees everything else."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _order(d: Diagnostic) -> tuple[str, int, int]:
    if d.span is None:
        return ("", 0, 0)
    return (d.span.file, d.span.line, d.span.column)


def compile_files(
    paths: Sequence[str | os.PathLike[str]], *, home: str | None = None,
) -> PolicySet:
    """Compile ``.sbpolicy`` files (and what they import) into one PolicySet.

    Several files are merged as if each imported the next: rules keep file order, every file
    after what it imports; the first file's header names the set.

    :param home: what ``~`` in path globs expands to (default: the current user's home).
    :raises DiagnosticsError: carrying every error diagnostic, when anything is wrong.
    """
    ctx = run_stages(paths, home=home)
    errors = [d for d in ctx.diagnostics if d.severity is Severity.ERROR]
    if errors or ctx.result is None:
        raise DiagnosticsError(errors or [Diagnostic.make("SBP100", "nothing compiled", None)])
    return ctx.result


def check_files(
    paths: Sequence[str | os.PathLike[str]], *, home: str | None = None,
) -> list[Diagnostic]:
    """Every diagnostic (errors and warnings) for ``paths``; never raises for bad input."""
    return run_stages(paths, home=home).diagnostics
