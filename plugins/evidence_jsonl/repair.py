"""Removing a torn (partly written) record from a JSONL log so the next record starts whole.

A record is written with one ``write`` on an ``O_APPEND`` descriptor. On a full disk that write
can be short: the first bytes of the record land and the rest does not. Left alone, the next
record (or the spooled copy of this one) would be appended to the same line, making one
unparseable line out of two records. Writers hold the exclusive ``flock`` while chaining and
appending and release it before a repair, which takes it again: no record is half-way through
a write while it looks.
"""

from __future__ import annotations

import fcntl
import logging
import os

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_SEARCH = 4 << 20  # how far back from the end a fragment moved by others' repairs is looked for
_UNIQUE = 96  # bytes from which a record's start holds its envelope id (searching is safe)


class TornRecord:
    """The bytes of one short write, where they landed, and the whole line they began."""

    __slots__ = ("fragment", "line", "start")

    def __init__(self, start: int, fragment: bytes, line: bytes) -> None:
        self.start = start
        self.fragment = fragment
        self.line = line


def _read(fd: int, size: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, min(size, _CHUNK), offset)
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def _cut(fd: int, start: int, length: int, size: int) -> None:
    """Remove ``length`` bytes at ``start`` from the file, moving what follows down."""
    tail = _read(fd, size - start - length, start + length)
    if tail:
        # pwrite on an O_APPEND descriptor appends on Linux: write through a second,
        # non-appending descriptor of the same open file
        plain = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)
        try:
            view = memoryview(tail)
            offset = start
            while view:
                n = os.pwrite(plain, view, offset)
                view, offset = view[n:], offset + n
        finally:
            os.close(plain)
    os.ftruncate(fd, start + len(tail))  # shrinking needs no free space


def _find(fd: int, torn: TornRecord, size: int) -> int | None:
    """Where the fragment is now: where it was written, or (moved when another process took
    out its own torn record) the oldest place in the file's tail where it starts a line. A
    complete copy of the record (replayed from the spool) is never taken for the fragment.
    """
    n = len(torn.fragment)
    if torn.start + n <= size and _fragment_at(fd, torn, torn.start, size):
        return torn.start
    if n < _UNIQUE:
        # too short to carry the envelope id: it could match the start of another, whole
        # record, and cutting that would damage a completed one
        return None
    base = max(0, size - _SEARCH)
    window = _read(fd, size - base, base)
    at = window.find(torn.fragment)  # the oldest: the fragment precedes any replayed copy
    while at >= 0:
        if _fragment_at(fd, torn, base + at, size):
            return base + at
        at = window.find(torn.fragment, at + 1)
    return None


def _fragment_at(fd: int, torn: TornRecord, at: int, size: int) -> bool:
    """The fragment starts a line at ``at`` and is not the start of a complete copy."""
    if at and os.pread(fd, 1, at - 1) != b"\n":
        return False
    here = os.pread(fd, min(len(torn.line), size - at), at)
    return here.startswith(torn.fragment) and here != torn.line


def remove_torn(fd: int, torn: TornRecord, path: object) -> None:
    """Take ``torn`` back out of the log (and anything glued to it stays, on its own line).

    :raises OSError: the file could not be locked, read or shortened; the caller keeps the
        fragment pending and must not append until a later attempt succeeds.
    """
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        size = os.fstat(fd).st_size
        at = _find(fd, torn, size)
        if at is None:  # already gone: the file was rotated or truncated meanwhile
            log.warning("evidence log `%s`: torn record of %d bytes no longer found", path,
                        len(torn.fragment))
            return
        _cut(fd, at, len(torn.fragment), size)
        log.warning("evidence log `%s`: removed a torn record of %d bytes (short write) at "
                    "offset %d", path, len(torn.fragment), at)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def trim_torn_tail(fd: int, path: object) -> int:
    """At open: drop an unterminated last line a crashed writer left (never a whole record:
    every whole record ends with a newline). Returns how many bytes were dropped.
    """
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return 0
        end = size
        keep = 0
        while end > 0:
            base = max(0, end - _CHUNK)
            nl = _read(fd, end - base, base).rfind(b"\n")
            if nl >= 0:
                keep = base + nl + 1
                break
            end = base
        os.ftruncate(fd, keep)
        log.warning("evidence log `%s`: dropped an unterminated last line of %d bytes left by "
                    "an interrupted write", path, size - keep)
        return size - keep
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
