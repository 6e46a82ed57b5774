"""Mask planning: which existing paths under mandatory denies a sandbox's binds would expose.

One walk serves every glob at once. It starts only where a glob can match (its literal prefix,
or a bind beneath it), never descends past the depth a ``**``-free glob can reach, and never
follows a symlink. ``<prefix>/**/<name>`` globs (the seed 003 list: ``**/.env``…) are matched
as one set intersection per directory, not one regex per entry.

A directory's listing is cached by ``(st_dev, st_ino, st_ctime_ns)``: adding, removing or
renaming an entry changes the directory's ctime, and a process cannot set ctime back (that needs
the clock, ``CAP_SYS_TIME``), so a warm plan costs one ``lstat`` per directory instead of a
``getdents`` of every entry. A listing taken less than ``RACY_NS`` after the directory changed
is not trusted next time (a change within the same clock tick would keep the same ctime).

There is no entry cap: a large tree costs time once (a cold walk), never a refusal.
Pure standard library; ``plugins/executor_proc`` and ``plugins/executor_docker`` both call it.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policy_engine.patterns.paths import PathGlob, expand_home, is_literal, literal_prefix

RACY_NS = 2_000_000_000
RUNTIME_DIRS: tuple[str, ...] = ("/run", "/var/run", "/var/lib/docker", "/var/lib/containerd",
                                 "/var/lib/containers", "/var/lib/kubelet")
"""Host control sockets (docker, containerd, dbus, systemd, podman, the user's runtime dir) live
here: never bound into a sandbox, and hidden under an empty read-only tmpfs when a bind contains
them, whatever the policy or ``root_fs`` says."""
RUNTIME_GLOBS: tuple[str, ...] = ("/tmp/pe-net-*", "/tmp/pe-proc-*", "/tmp/pe-docker-*",
                                  "/tmp/.X11-unix", "/tmp/.ICE-unix", "/tmp/dbus-*",
                                  "/tmp/tmux-*", "/tmp/ssh-*")
"""Other calls' policy proxies and private dirs, and the usual socket dirs under /tmp."""


def beneath(path: str, root: str) -> bool:
    """Segment-wise containment (``/w`` contains ``/w/x`` but never ``/w-evil``)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def under_runtime(path: str) -> bool:
    """Whether ``path`` (resolved) is a host runtime directory or lies beneath one."""
    real = os.path.realpath(path)
    return any(beneath(p, r) for p in (path, real) for r in RUNTIME_DIRS)


@dataclass(frozen=True, slots=True)
class MaskPlan:
    """Existing paths to hide (files under ``/dev/null``, directories under an empty tmpfs)."""

    files: tuple[str, ...]
    dirs: tuple[str, ...]
    dirs_visited: int
    dirs_listed: int


@dataclass(frozen=True, slots=True)
class _Listing:
    key: tuple[int, int, int]
    names: frozenset[str]
    subdirs: tuple[str, ...]
    trusted: bool


class DirCache:
    """Directory listings keyed by ctime; thread-safe enough (a race stores a fresh listing)."""

    def __init__(self, max_dirs: int = 500_000) -> None:
        self.max_dirs = max_dirs
        self._data: dict[str, _Listing] = {}
        self._lock = threading.Lock()

    def listing(self, path: str) -> tuple[_Listing | None, bool]:
        """(listing or None when ``path`` is no longer a directory, whether it was re-listed)."""
        try:
            st = os.lstat(path)
        except OSError:
            return None, False
        if not stat.S_ISDIR(st.st_mode):
            return None, False
        key = (st.st_dev, st.st_ino, st.st_ctime_ns)
        got = self._data.get(path)
        if got is not None and got.trusted and got.key == key:
            return got, False
        names: list[str] = []
        subdirs: list[str] = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    names.append(e.name)
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.name)
        except OSError:
            return None, True
        fresh = _Listing(key, frozenset(names), tuple(subdirs),
                         time.time_ns() - st.st_ctime_ns > RACY_NS)
        with self._lock:
            if len(self._data) >= self.max_dirs:
                self._data.clear()
            self._data[path] = fresh
        return fresh, True


DEFAULT_CACHE = DirCache()


@dataclass(frozen=True, slots=True)
class _Glob:
    glob: PathGlob
    prefix: str
    name: str | None  # `<prefix>/**/<name>`: matched by set intersection
    max_depth: int | None  # segments below the prefix a `**`-free glob can reach


def _compile(pattern: str, home: str) -> _Glob:
    expanded = expand_home(pattern, home)
    trimmed = expanded[:-3] if expanded.endswith("/**") else expanded
    prefix = literal_prefix(trimmed)
    segs = [s for s in trimmed.split("/") if s]
    rest = segs[len([s for s in prefix.split("/") if s]):]
    name = rest[1] if len(rest) == 2 and rest[0] == "**" and is_literal(rest[1]) else None
    depth = None if "**" in trimmed else len(rest)
    return _Glob(PathGlob.of(expanded, home), prefix, name, depth)


def plan_masks(bound: Sequence[str], system: Sequence[str], patterns: Iterable[str], home: str,
               cache: DirCache | None = None) -> MaskPlan:
    """Existing paths matching ``patterns`` that the binds ``bound`` (searched for every glob)
    or ``system`` (searched only for a glob whose literal prefix lies inside it) would expose.
    """
    cache = cache or DEFAULT_CACHE
    visible = [*bound, *system]
    found: set[str] = set()
    starts: dict[str, list[_Glob]] = {}
    for pattern in patterns:
        expanded = expand_home(pattern, home)
        trimmed = expanded[:-3] if expanded.endswith("/**") else expanded
        if is_literal(trimmed):
            if any(beneath(trimmed, b) for b in visible) and os.path.lexists(trimmed):
                found.add(trimmed)
            continue
        g = _compile(pattern, home)
        roots = [b for b in bound if beneath(b, g.prefix)]
        if g.prefix != "/" and any(beneath(g.prefix, b) for b in visible):
            roots.append(g.prefix)
        for r in roots:
            starts.setdefault(r, []).append(g)
    visited, listed = _walk(starts, cache, found)
    files, dirs = [], []
    for p in sorted(found):
        try:
            mode = os.lstat(p).st_mode
        except OSError:
            continue
        (dirs if stat.S_ISDIR(mode) else files).append(p)
    return MaskPlan(tuple(files), tuple(dirs), visited, listed)


def _walk(starts: dict[str, list[_Glob]], cache: DirCache, found: set[str]) -> tuple[int, int]:
    """One depth-first walk from the outermost start roots; nested starts join on the way."""
    tops = [r for r in starts if not any(q != r and beneath(r, q) for q in starts)]
    ancestors = {a for r in starts for a in _ancestors(r)}
    visited = listed = 0
    stack: list[tuple[str, tuple[_Glob, ...]]] = [(r, ()) for r in tops]
    while stack:
        d, inherited = stack.pop()
        active = inherited + tuple(starts.get(d, ()))
        got, relisted = cache.listing(d)
        visited += 1
        listed += relisted
        if got is None:
            continue
        base = d.rstrip("/")
        hit_names: set[str] = set()
        fast = {g.name for g in active if g.name is not None and beneath(d, g.prefix)}
        if fast and not fast.isdisjoint(got.names):
            hit_names |= fast & got.names
        slow = [g for g in active if g.name is None]
        for g in slow:
            hit_names.update(n for n in got.names if g.glob.matches(f"{base}/{n}"))
        found.update(f"{base}/{n}" for n in hit_names)
        for sub in got.subdirs:
            if sub in hit_names:
                continue  # masked whole: nothing beneath it needs its own mask
            path = f"{base}/{sub}"
            keep = tuple(g for g in active if g.max_depth is None
                         or path.count("/") - g.prefix.rstrip("/").count("/") < g.max_depth)
            if keep or path in ancestors or path in starts:
                stack.append((path, keep))
    return visited, listed


def _ancestors(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]
