"""The paths a proc sandbox binds for a profile, and the ``cwd`` it accepts: one answer for both
the guard (which decides the op) and the proc executors (which build the sandbox from it).

Binds have literal-prefix granularity: ``/w/*/out`` binds ``/w``. A ``cwd`` must lie beneath
``root_fs`` once its symlinks are followed (the process ``chdir``s through them) and beneath one
of the bound paths, or the process would start in a directory the sandbox does not show.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from policy_engine.errors import PolicyEngineError
from policy_engine.guard.paths import quote, resolve_beneath
from policy_engine.model import FsCapability, Profile
from policy_engine.patterns.paths import expand_home, literal_prefix
from policy_engine.sandbox.runtime_dirs import under_runtime


def beneath(path: str, root: str) -> bool:
    """Segment-wise containment (``/w`` contains ``/w/x`` but never ``/w-evil``)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def fs_prefixes(profile: Profile, kinds: Iterable[str]) -> list[str]:
    """Literal prefixes of the profile's fs capabilities of ``kinds``, clamped to root_fs.

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
        members = [[literal_prefix(expand_home(p, home)) for p in c.paths]
                   for c in pc.all_of if isinstance(c, FsCapability)]
        for cand in {p for m in members for p in m}:
            if all(any(beneath(cand, q) for q in m) for m in members):
                clamped = cand if beneath(cand, root) else root if beneath(root, cand) else None
                if clamped and os.path.isdir(clamped) and not os.path.islink(clamped):
                    out.add(clamped)
    # a path beneath another of the same list adds nothing
    return sorted(p for p in out if not any(q != p and beneath(p, q) for q in out))


def bound_paths(profile: Profile) -> tuple[list[str], list[str]]:
    """(readable, writable) prefixes a proc sandbox binds; host runtime dirs never are."""
    writable = fs_prefixes(profile, {"fs.write"})
    readable = [p for p in fs_prefixes(profile, {"fs.read", "fs.list"})
                if not any(beneath(p, w) for w in writable)]
    # host control sockets are a mandatory deny no policy lifts: never bind a runtime dir
    return ([p for p in readable if not under_runtime(p)],
            [p for p in writable if not under_runtime(p)])


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
