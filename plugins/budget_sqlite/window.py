"""Per-window counters of the SQLite meter in a shared-memory table beside its database.

A rate limit charged as an SQLite UPSERT costs one write transaction (≈ 50 µs) per request;
nobody needs the count after its minute, so it need not be durable. Every process using the
same state directory maps ``budget.rate`` (128 KiB: 4,096 slots of a 16-byte key digest, the
window and the count) and updates it under an exclusive ``flock`` (plus a thread lock: one
process's threads share the descriptor's lock), so the count is exact across processes and
threads, as the SQLite row was; a check costs a few microseconds. The file is in the page
cache, so a restarted server keeps the minute's count; a killed process drops its lock with
its descriptor. A key is looked up by linear probing over at most ``PROBE`` slots from its
digest's home slot; a slot of an older window is reused. When every probed slot holds a live
key of the current window (more than ``PROBE`` tenants colliding), the caller falls back to the
meter's SQLite charge (``Full``): still exact, only slower; so does it when the table cannot be
opened or mapped (``OSError``).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
from pathlib import Path

from plugins.budget_sqlite.mapped import lock_whole
from policy_engine.budget import exceeded
from policy_engine.pid import current as current_pid

SLOTS = 4096
PROBE = 64
_SLOT = struct.Struct("<16sqq")  # key digest, window, count
SIZE = SLOTS * _SLOT.size
_EMPTY = bytes(16)
# key -> (digest, home slot): a service charges one key per tenant on every request
_NAMED: dict[str, tuple[bytes, int]] = {}
_NAMED_MAX = 4096


def _named(key: str) -> tuple[bytes, int]:
    found = _NAMED.get(key)
    if found is None:
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        found = (digest, int.from_bytes(digest[:4], "little") % SLOTS)
        if len(_NAMED) >= _NAMED_MAX:
            _NAMED.clear()  # a cache, not a limit
        _NAMED[key] = found
    return found


class Full(Exception):
    """Every slot ``key`` may use holds another live key: count it elsewhere."""


class SharedWindows:
    """The table in ``path``; opened lazily, reopened after a fork (a forked child must not
    share its parent's open file description, whose ``flock`` they would hold together)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1
        self._map: mmap.mmap | None = None

    def _open(self) -> mmap.mmap:
        if self._map is not None and self._pid == current_pid():
            return self._map
        self._map = None  # a forked child's inherited mapping is left to the parent
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size < SIZE:  # a new file: zeroes are empty slots
                # blocks, not a hole: a write to a page of a hole on a full disk is a SIGBUS
                os.posix_fallocate(fd, 0, SIZE)
            self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._pid = fd, current_pid()
        return self._map

    def charge(self, key: str, window: int, limit: int) -> int:
        """One more for ``key`` in ``window`` within ``limit``; the new count.

        :raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` over ``limit``
        :raises Full: no slot for ``key``
        :raises OSError: the file cannot be used
        """
        digest, home = _named(key)
        with self._lock:
            table = self._open()
            lock_whole(self._fd, fcntl.LOCK_EX, SIZE, self.path)  # truncated: OSError, not SIGBUS
            try:
                free = -1
                for i in range(PROBE):
                    at = ((home + i) % SLOTS) * _SLOT.size
                    seen, seen_window, count = _SLOT.unpack_from(table, at)
                    if seen == digest:
                        if seen_window != window:
                            count = 0
                        if count + 1 > limit:
                            raise exceeded(key, "calls", limit, count, 1)
                        _SLOT.pack_into(table, at, digest, window, count + 1)
                        return int(count) + 1
                    if free < 0 and (seen_window < window or seen == _EMPTY):
                        free = at
                    if seen == _EMPTY:  # never used: the key is not further on
                        break
                if free < 0:
                    raise Full(key)
                if limit < 1:
                    raise exceeded(key, "calls", limit, 0, 1)
                _SLOT.pack_into(table, free, digest, window, 1)
                return 1
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def count(self, key: str, window: int) -> int:
        """What ``key`` counted in ``window``."""
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        home = int.from_bytes(digest[:4], "little") % SLOTS
        with self._lock:
            table = self._open()
            lock_whole(self._fd, fcntl.LOCK_SH, SIZE, self.path)
            try:
                for i in range(PROBE):
                    seen, seen_window, count = _SLOT.unpack_from(
                        table, ((home + i) % SLOTS) * _SLOT.size)
                    if seen == digest:
                        return int(count) if seen_window == window else 0
                    if seen == _EMPTY:
                        break
                return 0
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._lock:
            if self._map is not None and self._pid == current_pid():
                self._map.close()
                os.close(self._fd)
            self._map, self._fd = None, -1
