"""inotify over the directories a mask plan listed: which of them changed since a given moment.

Every directory gets its watch *before* it is listed, so a change made after its listing always
queues an event (an entry added, removed or renamed, or the directory's own owner or mode
changed: the local runner masks by owner). ``drain()`` reads the queue into a log of changed
directories (sequence numbers count its entries); a watched directory moved or deleted logs it
and its parent; a queue overflow or a failed watch is a *full* invalidation: every walk older
than it is checked again whole (``masks._WalkRecord.stale``). inotify is inode-based, so writes
made through a sandbox's bind mounts are seen alike. Linux only, ctypes; without inotify (or
past ``max_user_watches``) every plan checks every directory's stamp.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

IN_NAMES = 0x100 | 0x200 | 0x40 | 0x80  # CREATE, DELETE, MOVED_FROM, MOVED_TO
IN_SELF = 0x400 | 0x800  # DELETE_SELF, MOVE_SELF
IN_ATTRIB = 0x4  # counted for the watched directory itself only: a change of its owner
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
MASK = IN_NAMES | IN_SELF | IN_ATTRIB | IN_ONLYDIR | IN_DONT_FOLLOW
_EVENT = struct.Struct("iIII")
MAX_LOG = 100_000
AddWatch = Callable[[int, bytes, int], int]


def open_inotify() -> tuple[int, AddWatch] | None:
    """A non-blocking, close-on-exec inotify descriptor and libc's ``inotify_add_watch``
    (a negative answer sets ``ctypes.get_errno()``); ``None`` where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        add = libc.inotify_add_watch
        add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    except (OSError, AttributeError):
        return None
    return (fd, add) if fd >= 0 else None


def pending_events(fd: int) -> Iterator[tuple[int, int, bytes]]:
    """Every event queued on the inotify ``fd`` now, as (watch, mask, name: empty for the
    watched directory itself), read until the descriptor would block.

    :raises OSError: a read failed (the caller gives the descriptor up).
    """
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        off = 0
        while off + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, off)
            start = off + _EVENT.size
            off = start + length
            yield wd, mask, data[start:off].rstrip(b"\0")


class Watcher:
    """One inotify instance and the log of directories changed since it started."""

    def __init__(self) -> None:
        self.usable = False
        self.seq = 0  # INVARIANT: seq == log_start + len(log)
        self.full_seq = 0  # the last full invalidation; older walks are redone whole
        self._log: list[str] = []
        self._log_start = 0
        self._lock = threading.Lock()
        self._watched: set[str] = set()
        self._paths: dict[int, str] = {}
        self._fd = -1
        made = open_inotify()
        if made is not None:
            (self._fd, self._add), self.usable = made, True

    @property
    def fd(self) -> int:
        """The inotify descriptor (-1 when closed or never opened)."""
        return self._fd

    def _invalidate(self) -> None:
        """Caller holds the lock."""
        self.seq += 1
        self._log.clear()
        self._log_start = self.full_seq = self.seq
        self._watched.clear()  # moved or re-created directories must be watched again

    def watch(self, path: str) -> None:
        """Watch ``path`` (a directory about to be listed); a failure invalidates every walk."""
        if not self.usable or path in self._watched:
            return
        wd = self._add(self._fd, os.fsencode(path), MASK)
        with self._lock:
            if wd < 0:
                if ctypes.get_errno() in (errno.ENOSPC, errno.ENOMEM):
                    self.usable = False  # past max_user_watches: every plan walks from now on
                self._invalidate()
                return
            self._paths[wd] = path
            self._watched.add(path)

    def adopt(self, paths: Sequence[str], wds: Sequence[int]) -> bool:
        """Take the watches ``revalidate.changed`` added (one descriptor or ``-errno`` a path,
        in order). A path gone or no longer a directory (ENOENT, ENOTDIR) needs none: the
        same pass reports it changed. Any other failure invalidates every walk, as in
        ``watch``. Returns whether every other path is watched."""
        with self._lock:
            for path, wd in zip(paths, wds, strict=True):
                if wd > 0:
                    self._paths[wd] = path
                    self._watched.add(path)
                elif -wd not in (errno.ENOENT, errno.ENOTDIR):
                    if -wd in (errno.ENOSPC, errno.ENOMEM):
                        self.usable = False
                    self._invalidate()
                    return False
        return True

    def note(self, paths: Iterable[str]) -> None:
        """Log ``paths`` as changed, as events would (directories found changed by their
        stamps, ``listing_store``: the next plan re-walks them)."""
        with self._lock:
            before = len(self._log)
            self._log.extend(paths)
            self.seq += len(self._log) - before

    def drain(self) -> None:
        """Read every pending event into the log."""
        if not self.usable:
            with self._lock:
                self._invalidate()
            return
        with self._lock:
            try:
                for wd, mask, name in pending_events(self._fd):
                    self._event(wd, mask, name)
            except OSError:
                self.usable = False
                self._invalidate()
            if len(self._log) > MAX_LOG:
                self._invalidate()

    def _event(self, wd: int, mask: int, name: bytes) -> None:
        """Caller holds the lock."""
        if mask & IN_IGNORED:
            gone = self._paths.pop(wd, None)
            if gone is not None:
                self._watched.discard(gone)
            return
        if mask & IN_ATTRIB and name:
            return  # an entry's chmod/chown/utime: its listing is unchanged
        path = self._paths.get(wd)
        if mask & IN_Q_OVERFLOW or path is None:
            self._invalidate()
            return
        if mask & IN_SELF:
            # a watched directory deleted or moved: its parent (watched: it was walked
            # through it) logs the name's removal too, and a re-walk of the parent drops it
            # and walks whatever now has the name; a moved directory's later events still
            # come under its old path until its new place is listed, which watches it
            # again under the new one (the same descriptor). Only these are re-walked,
            # not every tree (an agent's `rm -rf build/` re-walked /usr: issue 27 item 4)
            self._log.append(os.path.dirname(path.rstrip("/")) or "/")
            self.seq += 1
        self._log.append(path)
        self.seq += 1

    def since(self, synced: int) -> list[str] | None:
        """Directories changed after sequence ``synced``; ``None``: walk everything again."""
        with self._lock:
            if not self.usable or synced < self.full_seq or synced < self._log_start:
                return None
            return self._log[synced - self._log_start:]

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd, self.usable = -1, False
