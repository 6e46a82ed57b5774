"""What the host keeps from other users in the system trees (/etc, /usr…), for a root sandbox.

A sandbox that is host uid 0 with its capabilities dropped (``proc-landlock`` run by root; bwrap
runs as an unprivileged uid instead, ``plugins/executor_proc/uid.py``) is the *owner* of every
root-only file: it could read ``/etc/docker/key.json`` (0600) although no policy granted
``/etc``. So anything in a system tree that an unprivileged host user could not read — a file
without ``o+r``, a directory without ``o+rx`` — is masked like a mandatory deny there: what
``nobody`` cannot read, that sandbox does not read either. The first scan of an engine process
lists the trees it is given (``/etc``: ≈ 15 ms; all system trees would be ≈ 3 s); later ones
reuse it.

Cache: a directory's verdict (its hidden entries and the subdirectories to descend into) is
kept until inotify (with ``IN_ATTRIB``: a ``chmod`` changes only the *entry's* ctime, never the
directory's) reports a change in it, or the directory's own ``(st_dev, st_ino, st_ctime_ns)``
differs. A plan with no change since the last one reuses the last answer after one drain of the
inotify queue. Without inotify, every directory costs one ``lstat`` per plan and the whole scan
is redone every ``REFRESH_S`` seconds (a chmod of an entry is seen within that time).
Pure standard library; ``plugins/executor_proc`` calls it.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from policy_engine.sandbox.watch import IN_ATTRIB, MASK, Watcher

REFRESH_S = 60.0
RACY_NS = 2_000_000_000  # a listing this close to the directory's change is not trusted


def hidden(mode: int) -> bool:
    """Whether an entry of ``mode`` is kept from other users (symlinks never are: the target
    decides)."""
    if stat.S_ISLNK(mode):
        return False
    if stat.S_ISDIR(mode):
        return mode & 0o005 != 0o005
    return mode & 0o004 == 0


@dataclass(frozen=True, slots=True)
class _Verdict:
    key: tuple[int, int, int]
    files: tuple[str, ...]
    dirs: tuple[str, ...]
    subdirs: tuple[str, ...]
    trusted: bool


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Paths to mask: files (under an empty file) and directories (under an empty tmpfs)."""

    files: tuple[str, ...]
    dirs: tuple[str, ...]


class UnreadableScan:
    """The scan with its cache; one per process is enough (``DEFAULT_SCAN``), thread-safe."""

    def __init__(self, watch: bool = True) -> None:
        self._lock = threading.Lock()
        self._dirs: dict[str, _Verdict] = {}
        self.watcher = Watcher(MASK | IN_ATTRIB) if watch else None
        self._synced = 0
        self._last: tuple[tuple[str, ...], Unreadable] | None = None
        self._refreshed = time.monotonic()
        self.listed = 0  # directories listed so far (the cost a test or benchmark reads)

    def scan(self, roots: Sequence[str]) -> Unreadable:
        """Every hidden path at or beneath ``roots`` (symlinks are not followed)."""
        key = tuple(roots)
        with self._lock:
            unchanged = self._invalidate()
            if unchanged and self._last is not None and self._last[0] == key:
                return self._last[1]
            files: list[str] = []
            dirs: list[str] = []
            stack: list[str] = []
            for r in roots:
                try:
                    mode = os.lstat(r).st_mode
                except OSError:
                    continue
                if hidden(mode):
                    (dirs if stat.S_ISDIR(mode) else files).append(r)
                elif stat.S_ISDIR(mode):
                    stack.append(r)
            while stack:
                d = stack.pop()
                v = self._dirs.get(d)
                if v is None or not self._fresh(d, v):
                    v = self._list(d)
                    if v is None:
                        continue
                files += v.files
                dirs += v.dirs
                stack += v.subdirs
            result = Unreadable(tuple(sorted(set(files))), tuple(sorted(set(dirs))))
            self._last = (key, result)
            return result

    def _invalidate(self) -> bool:
        """Drop the verdicts of changed directories; ``True`` when nothing changed at all."""
        w = self.watcher
        if w is None or not w.usable:
            if time.monotonic() - self._refreshed > REFRESH_S:
                self._dirs.clear()
                self._refreshed = time.monotonic()
            return False  # no change log: every directory is checked by its ctime
        w.drain()
        changed = w.since(self._synced)
        self._synced = w.seq  # INVARIANT: read before walking: a change during it is logged
        if changed is None:
            self._dirs.clear()
            return False
        for d in set(changed):
            self._dirs.pop(d, None)
        return not changed and all(v.trusted for v in self._dirs.values()) and w.usable

    def _fresh(self, d: str, v: _Verdict) -> bool:
        if self.watcher is not None and self.watcher.usable and v.trusted:
            return True  # watched before it was listed: any change since is in the log
        try:
            st = os.lstat(d)
        except OSError:
            return False
        return v.trusted and v.key == (st.st_dev, st.st_ino, st.st_ctime_ns)

    def _list(self, d: str) -> _Verdict | None:
        try:
            st = os.lstat(d)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        if self.watcher is not None:
            self.watcher.watch(d)  # INVARIANT: before listing, so no later change is missed
        files: list[str] = []
        dirs: list[str] = []
        subdirs: list[str] = []
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        mode = e.stat(follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if hidden(mode):
                        (dirs if stat.S_ISDIR(mode) else files).append(e.path)
                    elif stat.S_ISDIR(mode):
                        subdirs.append(e.path)
        except OSError:
            return None
        self.listed += 1
        v = _Verdict((st.st_dev, st.st_ino, st.st_ctime_ns), tuple(files), tuple(dirs),
                     tuple(subdirs), time.time_ns() - st.st_ctime_ns > RACY_NS)
        self._dirs[d] = v
        return v


DEFAULT_SCAN = UnreadableScan()
