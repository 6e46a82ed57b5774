"""The JSONL log's chain state: the last record's link, re-read whenever another writer moved it.

Called only with the log's exclusive ``flock`` held (see ``JsonlSink._append``), so the last
record read here is still the last one when the new record is written after it.
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy_engine.evidence.chain import chained, checkpoint, line_hash, link_of, next_link

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


class ChainTail:
    """Knows ``(seq, hash)`` of the last record this process wrote, and the file's size and
    mtime right after; when either differs, another process appended and the tail is re-read.
    """

    def __init__(self, signing_key: Ed25519PrivateKey | None, checkpoint_every: int) -> None:
        self._key = signing_key
        self._every = max(1, checkpoint_every)
        self._known: tuple[int, int, bytes] | None = None  # (size, mtime_ns, last line)

    @property
    def signing(self) -> bool:
        return self._key is not None

    def forget(self) -> None:
        self._known = None

    def _last(self, fd: int) -> bytes | None:
        st = os.fstat(fd)
        if self._known is not None and self._known[:2] == (st.st_size, st.st_mtime_ns):
            return self._known[2]
        return last_record(fd, st.st_size)

    def render(self, fd: int, record: bytes | None) -> bytes:
        """The bytes to append: the chained record, then a checkpoint over it when due (every
        ``checkpoint_every`` records); for ``record=None`` only a checkpoint over the last
        record, or nothing if it is already covered.
        """
        last = self._last(fd)
        out: list[bytes] = []
        if record is not None:
            seq, prev = next_link(last)
            last = chained(record, seq, prev)
            out.append(last)
            due = self._key is not None and seq % self._every == self._every - 1
        else:
            due = self._key is not None and last is not None and b'"type":"checkpoint"' \
                not in last[:40]
        if due and last is not None and self._key is not None:
            link = link_of(last)
            if link is not None:  # a log written before chaining has nothing to sign yet
                seq, prev = next_link(last)
                out.append(chained(checkpoint(self._key, link[0], line_hash(last)), seq, prev))
        return b"".join(x + b"\n" for x in out)

    def wrote(self, fd: int, data: bytes) -> None:
        st = os.fstat(fd)
        self._known = (st.st_size, st.st_mtime_ns, data[:-1].rsplit(b"\n", 1)[-1])
