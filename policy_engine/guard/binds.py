"""The paths a proc sandbox binds for a profile, and the ``cwd`` it accepts: one answer for both
the guard (which decides the op) and the proc executors (which build the sandbox from it).

A glob binds what it matches on disk when the call starts, never more: ``/w/**`` binds ``/w``,
``/w/*/out/**`` binds each existing ``/w/<x>/out`` (not ``/w``: its siblings may be other
tenants' workspaces, all owned by the one sandbox uid — outsider round 5, F09), ``/w/*/a.txt``
each existing ``/w/<x>/a.txt`` file (files are bound read-only; a writable bind is always a
directory). A wildcard match that is a directory without a ``/**`` after it is not bound (its
contents are not the glob's); symlinks are not followed; a glob whose expansion visits more
than ``MAX_EXPANSION_DIRS`` directories or yields more than ``MAX_GLOB_BINDS`` paths binds
nothing (fail closed: narrow it). A ``cwd`` must lie beneath
``root_fs`` once its symlinks are followed (the process ``chdir``s through them) and beneath one
of the bound paths, or the process would start in a directory the sandbox does not show.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from policy_engine.errors import PolicyEngineError
from policy_engine.guard.engine_state import WORKSPACES, EngineState
from policy_engine.guard.paths import quote, resolve_beneath
from policy_engine.model import FsCapability, Profile
from policy_engine.patterns.paths import expand_home, glob_regex, literal_prefix
from policy_engine.sandbox.runtime_dirs import under_runtime

MAX_EXPANSION_DIRS = 10_000
MAX_GLOB_BINDS = 256


def beneath(path: str, root: str) -> bool:
    """Segment-wise containment (``/w`` contains ``/w/x`` but never ``/w-evil``)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def fs_prefixes(profile: Profile, kinds: Iterable[str], files: bool = False) -> list[str]:
    """What the profile's fs capabilities of ``kinds`` bind (``glob_binds``: directories, and
    regular files with ``files``), clamped to root_fs.

    A conjunction (``all_of``) keeps a prefix only if every member has an ancestor-or-equal
    prefix: the deepest such prefix still covers the whole intersection.
    """
    wanted = frozenset(kinds)
    root = profile.mappings.root_fs.rstrip("/") or "/"
    home = profile.mappings.home
    out: set[str] = set()
    for pc in profile.capabilities:
        if pc.kind.value not in wanted:
            continue
        members = [[b for p in c.paths for b in glob_binds(expand_home(p, home))]
                   for c in pc.all_of if isinstance(c, FsCapability)]
        for cand in {p for m in members for p in m}:
            if all(any(beneath(cand, q) for q in m) for m in members):
                clamped = cand if beneath(cand, root) else root if beneath(root, cand) else None
                if clamped and not os.path.islink(clamped) and (
                        os.path.isdir(clamped) or files and os.path.isfile(clamped)):
                    out.add(clamped)
    # a path beneath another of the same list adds nothing
    return sorted(p for p in out if not any(q != p and beneath(p, q) for q in out))


def glob_binds(pattern: str) -> list[str]:
    """The existing paths a sandbox binds for one absolute glob (module doc)."""
    prefix = literal_prefix(pattern)
    segs = [g for g in pattern.split("/") if g]
    rest = segs[len([g for g in prefix.split("/") if g]):]
    if not rest or rest == ["**"]:
        return [prefix]
    rx = [None if g == "**" else glob_regex("/" + g) for g in rest]
    out: list[str] = []
    stack = [(prefix, 0)]
    seen: set[tuple[str, int]] = set()
    visited = 0
    while stack:
        d, i = stack.pop()
        if (d, i) in seen:
            continue
        seen.add((d, i))
        if rx[i] is None:  # `**`: everything beneath when last, else zero or more segments
            if i == len(rx) - 1:
                out.append(d)
                continue
            stack.append((d, i + 1))
        visited += 1
        if visited > MAX_EXPANSION_DIRS or len(out) > MAX_GLOB_BINDS:
            return []
        try:
            with os.scandir(d) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in it]
        except OSError:
            continue
        base = d.rstrip("/")
        seg = rx[i]
        for name, is_dir, is_link in entries:
            if is_link:
                continue
            path = f"{base}/{name}"
            if seg is None:
                if is_dir:
                    stack.append((path, i))
                continue
            if not seg.match("/" + name):
                continue
            if i == len(rx) - 1:
                if not is_dir:  # a directory matched without `/**` exposes no contents
                    out.append(path)
            elif is_dir:
                stack.append((path, i + 1))
    return [] if len(out) > MAX_GLOB_BINDS else sorted(set(out))


def bound_paths(profile: Profile) -> tuple[list[str], list[str]]:
    """(readable, writable) prefixes a proc sandbox binds; host runtime dirs never are.

    Inside ``one_view()`` each profile's answer is looked up on disk once: the executor's
    re-check, its identity choice and its plan ask it three or four times per call, and must
    all see the same binds (a glob's match appearing between two of them would otherwise be
    checked by one and bound by another)."""
    memo = _VIEW.get()
    if memo is not None:
        kept = memo.get(id(profile))
        if kept is not None and kept[0] is profile:
            return list(kept[1]), list(kept[2])
    writable = fs_prefixes(profile, {"fs.write"})
    readable = [p for p in fs_prefixes(profile, {"fs.read", "fs.list"}, files=True)
                if not any(beneath(p, w) for w in writable)]
    # host control sockets are a mandatory deny no policy lifts: never bind a runtime dir
    readable = [p for p in readable if not under_runtime(p)]
    writable = [p for p in writable if not under_runtime(p)]
    if memo is not None:
        memo[id(profile)] = (profile, tuple(readable), tuple(writable))
    return readable, writable


_VIEW: ContextVar[dict[int, tuple[Profile, tuple[str, ...], tuple[str, ...]]] | None] = \
    ContextVar("policy_engine_bind_view", default=None)


@contextmanager
def one_view() -> Iterator[None]:
    """One look at the disk for ``bound_paths`` while inside (one call's; nested: the outer
    one's). The profiles looked at are held only until the view ends."""
    if _VIEW.get() is not None:
        yield
        return
    token = _VIEW.set({})
    try:
        yield
    finally:
        _VIEW.reset(token)


def cwd_refusal(profile: Profile, cwd: str, bound: Iterable[str] | None = None) -> str | None:
    """Why a proc sandbox refuses ``cwd`` (a normalized absolute path), or ``None``.

    :param bound: the bound paths when the caller has them already (the proc plan).
    """
    root = profile.mappings.root_fs.rstrip("/") or "/"
    if "\x00" in cwd or ".." in cwd.split("/") or not beneath(cwd, root):
        return f"cwd {quote(cwd)} is not beneath root_fs"
    try:
        real = resolve_beneath(root, cwd)
    except PolicyEngineError:
        return f"cwd {quote(cwd)} is not beneath root_fs: a symlink on it leads out of the root"
    if bound is None:
        readable, writable = bound_paths(profile)
        bound = readable + writable
    if not any(beneath(real, b) for b in bound):
        return f"cwd {quote(cwd)} is not a readable path of the profile"
    return None


def state_masks(state: EngineState | None, binds: Iterable[str],
                keep: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(files, directories) a proc sandbox masks so that none of ``binds`` shows the engine's
    state directory (``engine_state.py``): the state dir itself when a bind is or holds it;
    when a bind or a ``keep`` path (the cwd) inside one of its workspaces must stay visible,
    each entry of the state dir but the workspaces instead; and a bind lying inside the state
    dir elsewhere. Masks come after the binds (bubblewrap's order), so a mask never lies
    beneath another one here."""
    if state is None:
        return [], []
    binds = list(binds)
    files: list[str] = []
    dirs: list[str] = []
    for root in state.roots:
        if not os.path.isdir(root) or os.path.islink(root):
            continue  # absent, or the spelling through a link (its real path is a root too)
        inside = [b for b in binds if b != root and beneath(b, root)]
        if any(beneath(root, b) for b in binds):
            if all(state.covers(b) for b in [*inside, *(k for k in keep if beneath(k, root))]):
                dirs.append(root)
                continue
            with os.scandir(root) as entries:
                for e in entries:
                    if e.name not in WORKSPACES:
                        (dirs if e.is_dir(follow_symlinks=False) else files).append(e.path)
            continue
        for b in inside:
            if state.covers(b):
                (dirs if os.path.isdir(b) and not os.path.islink(b) else files).append(b)
    return sorted(set(files)), sorted(set(dirs))
