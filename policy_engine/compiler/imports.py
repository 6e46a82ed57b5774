"""Stage ResolveImports: read the root files, follow `import`s, order units, detect cycles."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from policy_engine.compiler.context import CompileContext, Unit
from policy_engine.dsl import ast
from policy_engine.errors import Span

POLICY_SUFFIX = ".sbpolicy"
"""The only files an `import` reads (SBP217 for any other name)."""


@dataclass(slots=True)
class _Walk:
    ctx: CompileContext
    base_dir: str
    done: set[str] = field(default_factory=set)
    # the import chain being followed: (real path, display path)
    stack: list[tuple[str, str]] = field(default_factory=list)


def resolve_imports(ctx: CompileContext) -> None:
    """Fill ``ctx.units``: every file once, each preceded by what it imports (depth first).

    Root files keep their order; a file reached twice (a diamond) is parsed once. An import that
    closes a cycle is reported as SBP203 naming every file of the cycle, at the `import`.
    """
    if not ctx.paths:
        return
    first = os.path.realpath(os.fspath(ctx.paths[0]))
    walk = _Walk(ctx, os.path.dirname(first))
    for path in ctx.paths:
        shown = os.fspath(path)
        _visit(walk, os.path.realpath(shown), shown, root=True, via=None)


def _visit(walk: _Walk, real: str, shown: str, *, root: bool, via: ast.Import | None) -> None:
    ctx = walk.ctx
    chain = [r for r, _ in walk.stack]
    if real in chain:
        cycle = [s for _, s in walk.stack[chain.index(real):]] + [shown]
        span = via.path.span if via is not None else Span(shown, 1, 1)
        ctx.report("SBP203", "import cycle: " + " -> ".join(f"`{c}`" for c in cycle), span)
        return
    if real in walk.done:
        if root:  # given on the command line and already imported: mark it as a root too
            for unit in ctx.units:
                if os.path.realpath(unit.file.file) == real:
                    unit.root = True
        return
    if via is not None and not (via.path.value.endswith(POLICY_SUFFIX)
                                and real.endswith(POLICY_SUFFIX)):
        # Checked before the file is opened, even before it is looked for: an `import` of
        # `/etc/shadow`, or of a `.sbpolicy` symlink to it, must neither quote the secret in a
        # parse error in a CI log nor tell whether it exists.
        link = " (a link to a file with another name)" if via.path.value.endswith(
            POLICY_SUFFIX) else ""
        ctx.report("SBP217", f"import `{via.path.value}` is not a `{POLICY_SUFFIX}` file{link}; "
                   "it was not read", via.path.span)
        walk.done.add(real)
        return
    if via is not None and not os.path.exists(real):  # a pipe or directory: SBP100 on read
        ctx.report("SBP204", f"cannot find imported file `{via.path.value}` (looked for "
                   f"`{shown}`)", via.path.span)
        walk.done.add(real)
        return
    pf, diags = ctx.read_policy(real, shown)
    ctx.diagnostics.extend(diags)
    walk.done.add(real)
    if pf is None:
        return
    walk.stack.append((real, shown))
    here_real, here_shown = os.path.dirname(real), os.path.dirname(shown)
    for imp in pf.imports:
        target = imp.path.value
        if not target:
            ctx.report("SBP204", "empty import path", imp.path.span)
            continue
        child_real = os.path.realpath(os.path.join(here_real, target))
        child_shown = os.path.normpath(os.path.join(here_shown, target))
        _visit(walk, child_real, child_shown, root=False, via=imp)
    walk.stack.pop()
    rel = os.path.relpath(real, walk.base_dir).replace(os.sep, "/")
    ctx.units.append(Unit(pf, rel, root))


def bundle_files(paths: Sequence[str | os.PathLike[str]], home: str) -> list[str]:
    """What compiling ``paths`` would read now (display paths, as ``PolicySet.files`` names
    them), plus every ``.sbpolicy`` import target that is not there yet: the files a watcher
    of the bundle on disk must look at (the reloader's writer check covers each of them)."""
    ctx = CompileContext(paths=tuple(paths), home=home)
    resolve_imports(ctx)
    files = {os.fspath(p) for p in paths}
    for unit in ctx.units:
        files.add(unit.file.file)
        here = os.path.dirname(unit.file.file)
        for imp in unit.file.imports:
            if imp.path.value.endswith(POLICY_SUFFIX):
                files.add(os.path.normpath(os.path.join(here, imp.path.value)))
    return sorted(files)
