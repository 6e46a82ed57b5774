"""Directory listings for the mask planner, cached by ``(st_dev, st_ino, st_ctime_ns)``.

Adding, removing or renaming an entry changes the directory's ctime, and a process cannot set
ctime back (that needs the clock, ``CAP_SYS_TIME``), so a warm plan costs one ``lstat`` per
directory instead of a ``getdents`` of every entry. A listing taken less than ``RACY_NS`` after
the directory changed is not trusted next time (a change within the same clock tick would keep
the same ctime). A directory holding more than ``MAX_DIR_ENTRIES`` entries is never listed past
the cap (``masks``: masked whole). Memory is bounded in bytes, not entries (issue 32 item 11):
the listings, the hard-link listings and the walk records (``masks._WalkRecord``) each have a
share of ``DirCache.max_bytes`` and the oldest go first; the newest walk record stays even
when it alone is past its share (a whole host's: its size is bounded by the walk's directory
budget, ``masks.MAX_PLAN_DIRS``). A forked child starts empty (its
parent's inotify instance and locks are not its own).
"""

from __future__ import annotations

import os
import stat
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from policy_engine.sandbox.watch import Watcher

if TYPE_CHECKING:
    from policy_engine.sandbox.masks import _WalkRecord

RACY_NS = 2_000_000_000
MAX_DIR_ENTRIES = 100_000
DEFAULT_MAX_BYTES = 64 << 20
_NAME_COST, _PATH_COST, _DIR_COST = 90, 60, 200  # CPython object and set-slot overheads


@dataclass(frozen=True, slots=True)
class _Listing:
    key: tuple[int, int, int]
    names: frozenset[str]
    subdirs: tuple[str, ...]
    subpaths: tuple[str, ...]  # the subdirectories' full paths, so a warm walk builds none
    trusted: bool
    too_big: bool = False  # more than MAX_DIR_ENTRIES: not listed, masked whole
    cost: int = 0  # approximate bytes held


Listing = _Listing


def _cost(names: Sequence[str], subpaths: Sequence[str]) -> int:
    return (_DIR_COST + sum(_NAME_COST + len(n) for n in names)
            + sum(_PATH_COST + len(p) for p in subpaths))


class DirCache:
    """Directory listings keyed by ctime; thread-safe enough (a race stores a fresh listing).

    ``max_bytes``: what listings (half), walk records (a quarter) and hard-link listings (a
    quarter) may hold together, approximately; past its share each drops its oldest entries
    (the newest walk record stays, whatever its size).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, watch: bool = True) -> None:
        self.max_bytes = max_bytes
        self._data: dict[str, _Listing] = {}
        self._data_bytes = 0
        self._lock = threading.Lock()
        # held while a walk record is re-walked in part and while ``listing_store`` copies the
        # records: a copy taken halfway would store a directory's new stamp without the new
        # subdirectory beneath it, and the next start would never walk that subdirectory
        self.walk_lock = threading.Lock()
        self.watcher = Watcher() if watch else None
        self.walks: dict[object, _WalkRecord] = {}
        self._walk_bytes = 0
        self._linked: dict[str, tuple[tuple[int, int, int], tuple[tuple[str, tuple[int, int]],
                                                                    ...]]] = {}
        self._linked_bytes = 0
        self.entries_listed = 0  # names read by getdents since start (a bound, for tests)
        _CACHES.add(self)

    def forget(self) -> None:
        """Start empty, with a lock and an inotify instance of its own (every plan walks again).

        Run in a forked child (``serve --workers``): the parent's inotify instance is shared
        with every sibling, and the events one process reads the others never see, so a child
        trusting its inherited walk records would miss a file planted after the fork (a secret
        left unmasked); and a lock held by a parent's thread at the fork is never released."""
        self._lock = threading.Lock()
        self.walk_lock = threading.Lock()
        self._data, self._data_bytes = {}, 0
        self.walks, self._walk_bytes = {}, 0
        self._linked, self._linked_bytes = {}, 0
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = Watcher()

    def adopt_walk(self, key: object, rec: _WalkRecord) -> None:
        """Take a stored walk (``listing_store``) as the walk of ``key`` unless one is held;
        the next plan of ``key`` reuses it only for what ``rec.stale`` or the watcher vouch."""
        if key not in self.walks:
            self.remember_walk(key, rec, True)

    def held_bytes(self) -> int:
        """The approximate bytes held (listings, walk records, hard-link listings)."""
        return self._data_bytes + self._walk_bytes + self._linked_bytes

    def _evict(self, table: dict[Any, Any], held: int, share: int,
               cost: Callable[[Any], int], *, keep_newest: bool = False) -> int:
        """Drop ``table``'s oldest entries until ``held`` is below 3/4 of ``share``; caller
        holds the lock. Returns what is held after. ``keep_newest``: the entry just added
        stays even when it alone is past the share."""
        if held <= share:
            return held
        for k in list(table)[:-1] if keep_newest else list(table):
            held -= cost(table.pop(k))
            if held <= share * 3 // 4:
                break
        return max(held, 0)

    def remember_walk(self, key: object, rec: _WalkRecord, changed: bool = True) -> None:
        """Keep ``rec`` as the newest walk of ``key`` (within the walk records' share);
        ``changed``: it was walked (or partly) since it was last measured."""
        with self._lock:
            old = self.walks.pop(key, None)
            if old is not None:
                self._walk_bytes -= old.cost
            if changed or old is not rec:
                rec.cost = rec.measure()
                rec.dirty = True
            self.walks[key] = rec
            # the newest record stays whatever its size (a whole host's, bound with
            # ``allowReadOutside``: ~19 MB for 73,000 directories against a 16 MB share):
            # evicted by its own insertion, every plan walked the whole host again. Its size
            # is bounded by the walk's directory budget (``masks.MAX_PLAN_DIRS``)
            self._walk_bytes = self._evict(self.walks, self._walk_bytes + rec.cost,
                                           self.max_bytes // 4, lambda r: int(r.cost),
                                           keep_newest=True)

    def listing(self, path: str) -> tuple[_Listing | None, bool]:
        """(listing or None when ``path`` is no longer a directory, whether it was re-listed)."""
        try:
            st = os.lstat(path)
        except OSError:
            return None, False
        got = self._data.get(path)
        if got is not None and got.trusted and got.key == (st.st_dev, st.st_ino, st.st_ctime_ns):
            return got, False
        return self.relist(path, st), True

    def relist(self, path: str, st: os.stat_result) -> _Listing | None:
        """List ``path`` (whose ``lstat`` is ``st``) and remember it."""
        if not stat.S_ISDIR(st.st_mode):
            return None
        if self.watcher is not None:
            self.watcher.watch(path)  # INVARIANT: before listing, so no later change is missed
        names: list[str] = []
        subdirs: list[str] = []
        # a directory's size grows with its entries (ext4 ~16+ bytes each, tmpfs 20): past
        # this it holds more than MAX_DIR_ENTRIES on every file system here, unlisted
        too_big = st.st_size > MAX_DIR_ENTRIES * 40
        try:
            with os.scandir(path) as it:
                for e in it:
                    if too_big or len(names) >= MAX_DIR_ENTRIES:
                        too_big = True
                        break
                    names.append(e.name)
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.name)
        except OSError:
            return None
        self.entries_listed += len(names) + too_big
        key, trusted = (st.st_dev, st.st_ino, st.st_ctime_ns), \
            time.time_ns() - st.st_ctime_ns > RACY_NS
        if too_big:  # remembered by ctime as a verdict: a warm plan lists nothing again
            fresh = _Listing(key, frozenset(), (), (), trusted, True, _DIR_COST)
        else:
            base = path.rstrip("/")
            subpaths = tuple(f"{base}/{n}" for n in subdirs)
            fresh = _Listing(key, frozenset(names), tuple(subdirs), subpaths, trusted, False,
                             _cost(names, subpaths))
        with self._lock:
            old = self._data.pop(path, None)
            held = self._data_bytes - (old.cost if old is not None else 0) + fresh.cost
            self._data[path] = fresh
            self._data_bytes = self._evict(self._data, held, self.max_bytes // 2,
                                           lambda listing: int(listing.cost))
        return fresh


    def linked(self, path: str) -> tuple[tuple[str, tuple[int, int]], ...]:
        """The regular files in directory ``path`` with more than one link, with their
        ``(st_dev, st_ino)``; kept per directory ``(st_dev, st_ino, st_ctime_ns)`` (a new name
        changes the directory's ctime)."""
        try:
            st = os.lstat(path)
        except OSError:
            return ()
        key = (st.st_dev, st.st_ino, st.st_ctime_ns)
        got = self._linked.get(path)
        if got is not None and got[0] == key and time.time_ns() - st.st_ctime_ns > RACY_NS:
            return got[1]
        out: list[tuple[str, tuple[int, int]]] = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        est = e.stat(follow_symlinks=False)
                        if est.st_nlink > 1:
                            out.append((e.name, (est.st_dev, est.st_ino)))
        except OSError:
            return ()
        with self._lock:
            old = self._linked.pop(path, None)
            held = self._linked_bytes - (_linked_cost(old) if old is not None else 0)
            self._linked[path] = (key, tuple(out))
            self._linked_bytes = self._evict(self._linked, held + _linked_cost(self._linked[path]),
                                             self.max_bytes // 4, _linked_cost)
        return tuple(out)


def _linked_cost(entry: tuple[object, tuple[tuple[str, tuple[int, int]], ...]]) -> int:
    return _DIR_COST + sum(_NAME_COST + 60 + len(n) for n, _ in entry[1])


_CACHES: weakref.WeakSet[DirCache] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_CACHES):
        cache.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
DEFAULT_CACHE = DirCache()
