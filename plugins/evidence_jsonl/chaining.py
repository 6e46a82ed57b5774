"""The JSONL log's chain state: the last record's link, re-read whenever another writer moved it.

Called only with the log's exclusive ``flock`` held (see ``JsonlSink._append``), so the last
record read here is still the last one when the new record is written after it.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy_engine.evidence.chain import GENESIS, chained, checkpoint, line_hash, link_of

_CHUNK = 64 << 10


def last_record(fd: int, size: int) -> bytes | None:
    """The last newline-terminated line of the file (a torn unterminated tail is skipped)."""
    buf, base = b"", size
    while (nl := buf.rfind(b"\n")) < 0:
        if base == 0:
            return None
        lower = max(0, base - _CHUNK)
        buf, base = os.pread(fd, base - lower, lower) + buf, lower
    line_end = nl
    while (start := buf.rfind(b"\n", 0, line_end)) < 0 and base > 0:
        lower = max(0, base - _CHUNK)
        chunk = os.pread(fd, base - lower, lower)
        buf, base, line_end = chunk + buf, lower, line_end + len(chunk)
    return buf[start + 1:line_end]


class Tail(NamedTuple):
    """Where the chain stands after the log's last record."""

    seq: int  # the seq of the next record
    prev: str  # the hash of the last record
    chained: bool  # the last record carries a link (False: empty log, or written before)
    checkpoint: bool  # the last record is a checkpoint


def tail_of(last: bytes | None) -> Tail:
    if last is None:
        return Tail(0, GENESIS, False, False)
    link = link_of(last)
    if link is None:
        return Tail(0, line_hash(last), False, False)
    return Tail(link[0] + 1, link[1], True, b'"type":"checkpoint"' in last[:40])


class ChainTail:
    """Knows the chain state after the last record this process wrote, and the file's size and
    mtime right after; when either differs, another process appended and the tail is re-read.
    """

    def __init__(self, signing_key: Ed25519PrivateKey | None, checkpoint_every: int) -> None:
        self._key = signing_key
        self._every = max(1, checkpoint_every)
        self._known: tuple[int, int, Tail] | None = None  # (size, mtime_ns, tail)
        self._pending: Tail | None = None

    @property
    def signing(self) -> bool:
        return self._key is not None

    def forget(self) -> None:
        self._known = None

    def _tail(self, fd: int) -> Tail:
        st = os.fstat(fd)
        if self._known is not None and self._known[:2] == (st.st_size, st.st_mtime_ns):
            return self._known[2]
        return tail_of(last_record(fd, st.st_size))

    def render(self, fd: int, records: tuple[bytes, ...]) -> bytes:
        """The bytes to append: each record chained to the one before, each followed by a
        checkpoint over it when one is due (every ``checkpoint_every`` records); for no
        records only a checkpoint over the last record, or nothing if it is already covered.
        """
        tail = self._tail(fd)
        out: list[bytes] = []
        if not records and tail.chained and not tail.checkpoint:
            tail = self._checkpoint(tail, out)
        for record in records:
            line = chained(record, tail.seq, tail.prev)
            out.append(line)
            tail = Tail(tail.seq + 1, line_hash(line), True, False)
            if tail.seq % self._every == 0:
                tail = self._checkpoint(tail, out)
        self._pending = tail
        return b"".join(x + b"\n" for x in out)

    def _checkpoint(self, tail: Tail, out: list[bytes]) -> Tail:
        """A signed checkpoint over ``tail`` appended to ``out`` (none without a key)."""
        if self._key is None:
            return tail
        cp = chained(checkpoint(self._key, tail.seq - 1, tail.prev), tail.seq, tail.prev)
        out.append(cp)
        return Tail(tail.seq + 1, line_hash(cp), True, True)

    def wrote(self, fd: int) -> None:
        """The rendered bytes are in the file: remember where the chain stands now."""
        st = os.fstat(fd)
        self._known = (st.st_size, st.st_mtime_ns, self._pending) if self._pending else None
