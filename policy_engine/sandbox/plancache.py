"""A proc call's mask plan reused while nothing it was computed from changed (issue 27 item 4).

A plan (``plugins/executor_proc/spec._masks``) reads three things from the disk: the walks of
the trees it searches, which the mask watcher vouches for (``watch.py``: every walked directory
watched before it was listed; ``MaskPlan.vouched``); a few paths outside those walks, each
resolved through ``realpath`` (every bind, every pattern's fixed prefix, every masked path) and
then looked at (``lstat``, existence, link count); and the literal deny trees searched for hard
links (``hardlinks.linked_secrets``). Here every existing ancestor directory of each of those
paths, as given and as resolved, and every directory of those trees gets an inotify watch of
its own, in which an event counts when it names an entry the plan depends on (the next
directory on a path's way down, the path itself; every entry of a deny tree): created, removed,
renamed, its mode, owner or link count changed; the directory itself removed or moved, a queue
overflow always count. The mount table is polled for a change (``POLLPRI`` on
``/proc/self/mountinfo``: a mount moves no name) and compared with the one last seen (a
mount made and gone between two plans, as a call's id-mapped bind, is no change).

A plan is stored only when every one of its paths was watched before the plan began (the first
plan of a profile adds the watches, the second is stored, later ones reuse it), and reused only
while the mask watcher has logged no change beneath the roots of its walks since (another
workspace's churn does not count), no watch here has fired and the mount table has not
changed; a watch that cannot be added (``max_user_watches``), a walk the watcher does not
vouch for, or a fork (the inotify queues would be shared) means no reuse. A secret planted
between two calls therefore always reaches the next call's plan
(``tests/integration/test_plan_reuse.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from policy_engine.sandbox.runtime_dirs import beneath
from policy_engine.sandbox.watch import (
    IN_ATTRIB,
    IN_DONT_FOLLOW,
    IN_IGNORED,
    IN_Q_OVERFLOW,
    IN_SELF,
    MASK,
    Watcher,
    open_inotify,
    pending_events,
)

# a file's own: its link count reaches no watch of its directory (fsnotify_link_count)
FILE_MASK = IN_SELF | IN_ATTRIB | IN_DONT_FOLLOW
MAX_ENTRIES = 64
"""Plans kept (one per distinct profile and binds); the oldest goes first."""
MAX_DEPS = 4096
"""Directories one plan may depend on; a plan needing more is not kept."""
MAX_WATCHES = 8192
MAX_NAMES = 100_000
"""Past either (a service binding a new workspace per call adds a name or a watch each time)
the cache starts over, empty, with a new inotify instance: bounded, never stale."""


@dataclass(frozen=True, slots=True)
class Token:
    """What a plan was computed under: the mask watcher's sequence, this module's event count,
    the mount table's change count and how many watches had been tried."""

    watcher: Watcher | None
    seq: int
    full_seq: int
    events: int
    mounts: int
    added: int


ALL = ""
"""A dependency on every name in a directory (a literal deny tree's, searched whole)."""


class PlanCache:
    """The kept plans and the watches they depend on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[Any, tuple[Token, Any, tuple[str, ...]]] = {}
        self._wds: dict[str, int] = {}  # directory -> its watch
        self._paths: dict[int, str] = {}
        # (directory, name in it, or ALL) -> when it was first depended on (the order of
        # ``_order``): an event for another name of a watched directory does not count (an
        # ancestor such as /tmp sees every other user's files come and go)
        self._names: dict[tuple[str, str], int] = {}
        self._counted: dict[str, set[str]] = {}  # directory -> the names of it that count
        # directories missing or links when watched: their parent's watch reports a change of
        # the name (and then they are tried again: any counted event clears this)
        self._skipped: set[str] = set()
        self._order = 0
        self.events = 0
        self.mounts = 0
        self.usable = False
        self._fd = -1
        self._mountinfo: Any = None
        self._mount_table = b""
        self._poll: Any = None
        self._quiet_poll: Any = None  # ``_quiet``'s, for the watcher descriptor ``_quiet_fd``
        self._quiet_fd = -1
        self._mount_changed = False  # seen by ``_quiet``, for ``_drain`` to read the table
        made = open_inotify()
        if made is None:
            return
        self._fd, self._add = made
        try:
            self._mountinfo = open("/proc/self/mountinfo", "rb")  # noqa: SIM115 - held open
            self._mount_table = self._mountinfo.read()
            self._poll = select.poll()
            self._poll.register(self._mountinfo.fileno(), select.POLLPRI | select.POLLERR)
        except (OSError, AttributeError):
            self.close()
            return
        self.usable = self._fd >= 0

    def close(self) -> None:
        self.usable = False
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if self._mountinfo is not None:
            self._mountinfo.close()
            self._mountinfo = None
        self._plans.clear()

    def _drain(self) -> None:
        """Count every pending event that concerns a kept plan (caller holds the lock)."""
        try:
            for wd, mask, name in pending_events(self._fd):
                d = self._paths.get(wd)
                if mask & IN_Q_OVERFLOW or d is None:
                    self._count()
                elif mask & IN_IGNORED:  # the directory is gone: watched again when needed
                    self._paths.pop(wd, None)
                    self._wds.pop(d, None)
                    self._count()
                elif mask & IN_SELF or not name:
                    self._count()
                else:
                    counted = self._counted.get(d, set())
                    if ALL in counted or os.fsdecode(name) in counted:
                        self._count()
        except OSError:
            self.close()
            return
        changed, self._mount_changed = self._mount_changed, False
        if (changed or self._poll is not None and self._poll.poll(0)) \
                and self._mountinfo is not None:
            # a change since the last look; the same table again (a call's id-mapped mount,
            # made and gone: owner.py) is no change: the same mounts give the same view
            self._mountinfo.seek(0)
            table = self._mountinfo.read()
            if table != self._mount_table:
                self._mount_table = table
                self.mounts += 1

    def _quiet(self, watcher: Watcher) -> bool:
        """Nothing to drain (caller holds the lock): no event queued on this cache's inotify
        descriptor nor on ``watcher``'s, and the mount table unchanged — one ``poll(2)`` for
        all three, where the drains cost two reads that fail and their Python on every kept
        plan's use (issue 27 item 4). A watcher that is not usable is never quiet (its drain
        invalidates it)."""
        if not watcher.usable or watcher.fd < 0 or self._mountinfo is None:
            return False
        if self._quiet_fd != watcher.fd:
            poll = select.poll()
            poll.register(self._fd, select.POLLIN)
            poll.register(watcher.fd, select.POLLIN)
            poll.register(self._mountinfo.fileno(), select.POLLPRI | select.POLLERR)
            self._quiet_poll, self._quiet_fd = poll, watcher.fd
        ready = self._quiet_poll.poll(0)
        if any(fd == self._mountinfo.fileno() for fd, _ in ready):
            # the table's poll reports a change once (the kernel notes it as seen): the drain's
            # own poll will not see it again
            self._mount_changed = True
        return not ready

    def _count(self) -> None:
        self.events += 1
        self._skipped.clear()

    def token(self, watcher: Watcher | None) -> Token | None:
        """Taken before a plan is computed; ``None``: nothing can be kept now."""
        with self._lock:
            if not self.usable or watcher is None or not watcher.usable:
                return None
            self._drain()
            watcher.drain()
            return Token(watcher, watcher.seq, watcher.full_seq, self.events, self.mounts,
                         self._order)

    def get(self, key: Any, watcher: Watcher | None) -> Any:
        """The plan kept for ``key`` if nothing it depends on changed since, else ``None``."""
        with self._lock:
            kept = self._plans.get(key)
            if kept is None or not self.usable or watcher is None:
                return None
            if not self._quiet(watcher):
                self._drain()
                watcher.drain()
            tok, plan, walked = kept
            changed = watcher.since(tok.seq) if tok.watcher is watcher else None
            if (self.usable and changed is not None and watcher.full_seq == tok.full_seq
                    and self.events == tok.events and self.mounts == tok.mounts
                    and not any(beneath(d, top) for d in changed for top in walked)):
                if changed:  # in other trees: look at new changes only next time
                    self._plans[key] = (replace(tok, seq=watcher.seq), plan, walked)
                return plan
            del self._plans[key]
            return None

    def put(self, key: Any, tok: Token | None, plan: Any, paths: Iterable[str],
            trees: Iterable[str] = (), files: Iterable[str] = (),
            walked: Iterable[str] = ("/",)) -> None:
        """Keep ``plan`` (computed after ``tok``) if every name it depends on (each of
        ``paths`` and their ancestors; every name in ``trees``; the link count and mode of
        each of ``files``, regular files whose link count the plan read) was watched before
        ``tok``; else watch them now, for the next plan of ``key``. ``walked``: the top roots
        of the plan's walks; a change the mask watcher logs elsewhere keeps the plan."""
        if tok is None:
            return
        needed = dependencies([*paths, *files], trees)
        own = [f for f in files if _regular(f)]
        with self._lock:
            if not self.usable or len(needed) > MAX_DEPS:
                return
            if len(self._wds) > MAX_WATCHES or len(self._names) > MAX_NAMES:
                self.close()
                _renew(self)
                return
            fresh = False
            for f in own:
                if f not in self._wds:  # a failed watch makes it unusable: no plan kept below
                    self._watch(f, FILE_MASK)
                    fresh = True
            for d, names in needed.items():
                if d in self._skipped:
                    continue
                if d not in self._wds:
                    fresh = True
                    if not self._watch(d):
                        continue
                counted = self._counted.setdefault(d, set())
                for n in names:
                    at = self._names.get((d, n))
                    if at is None:
                        fresh = True
                        self._order += 1
                        self._names[(d, n)] = self._order
                        counted.add(n)
                    elif at > tok.added:
                        fresh = True
            if fresh or not self.usable:
                return
            if len(self._plans) >= MAX_ENTRIES:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = (tok, plan, tuple(walked))

    def _watch(self, d: str, mask: int = MASK) -> bool:
        """Caller holds the lock. A directory missing or replaced by a link since needs no
        watch (its parent's reports the name); any other failure ends the reuse."""
        wd = self._add(self._fd, os.fsencode(d), mask)
        self._order += 1
        if wd < 0:
            if ctypes.get_errno() in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                self._skipped.add(d)
            else:
                self.close()
            return False
        self._paths[wd] = d
        self._wds[d] = wd
        return True


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def dependencies(paths: Iterable[str], trees: Iterable[str] = ()) -> dict[str, set[str]]:
    """Directory -> the names in it a plan depends on: each ancestor of every path (and of
    every tree) with the name on the way down; every name of a tree (``ALL``)."""
    out: dict[str, set[str]] = {}
    tops = [t.rstrip("/") or "/" for t in trees]
    for t in tops:
        out.setdefault(t, set()).add(ALL)
    for p in (*paths, *tops):
        p = p.rstrip("/")
        while p:
            parent, _, name = p.rpartition("/")
            out.setdefault(parent or "/", set()).add(name)
            p = parent
    return out


class Recorder:
    """A ``realpath`` that notes every path it was asked and every answer."""

    def __init__(self, realpath: Callable[[str], str]) -> None:
        self._realpath = realpath
        self.paths: list[str] = []

    def __call__(self, path: str) -> str:
        real = self._realpath(path)
        self.paths.append(path)
        self.paths.append(real)
        return real


_CACHE: list[PlanCache] = []
_CACHE_LOCK = threading.Lock()


def cache() -> PlanCache:
    """The process's plan cache (made on first use)."""
    if not _CACHE:
        with _CACHE_LOCK:
            if not _CACHE:
                _CACHE.append(PlanCache())
    return _CACHE[0]


def _renew(old: PlanCache) -> None:
    with _CACHE_LOCK:
        if _CACHE and _CACHE[0] is old:
            _CACHE[0] = PlanCache()


def _forget_after_fork() -> None:
    # a child shares the parent's inotify queue: the events one process reads the other never
    # sees, so neither may trust a kept plan (as dircache.forget does for the walks)
    global _CACHE_LOCK
    _CACHE_LOCK = threading.Lock()
    for kept in _CACHE:
        kept.close()
    _CACHE.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
