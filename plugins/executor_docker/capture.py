"""Bounded capture of a stream: keep the head and the tail, count the rest, never stop reading.

Seed 002 §5.1: output beyond the limit is truncated, the process is *not* killed; the stream is
drained to the end so the process never blocks on a full pipe.
"""

from __future__ import annotations

from collections import deque

TRUNCATION_MARK = b"\n[... %d bytes truncated ...]\n"


class HeadTail:
    """Keeps at most ``limit`` bytes: the first half and the last half of everything fed.

    :param limit: bytes kept in total (head + tail); 0 keeps nothing.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.head_limit = self.limit - self.limit // 2
        self.tail_limit = self.limit // 2
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk or self.tail_limit == 0:
            return
        if len(chunk) >= self.tail_limit:
            self._tail.clear()
            self._tail.append(chunk[-self.tail_limit:])
            self._tail_len = self.tail_limit
            return
        self._tail.append(chunk)
        self._tail_len += len(chunk)
        while self._tail_len - len(self._tail[0]) >= self.tail_limit:
            self._tail_len -= len(self._tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def tail(self) -> bytes:
        data = b"".join(self._tail)
        return data[-self.tail_limit:] if self.tail_limit else b""

    def kept(self) -> bytes:
        """Head and tail; when truncated, a one-line marker says how much was dropped."""
        if not self.truncated:
            return bytes(self.head) + self.tail()
        dropped = self.total - len(self.head) - len(self.tail())
        return bytes(self.head) + TRUNCATION_MARK % dropped + self.tail()
