"""Bounded capture of an output stream: head and tail kept, everything counted and digested.

Executors drain a child's stdout/stderr to the end (so it never blocks on a full pipe) while
keeping at most ``limit`` bytes in memory: the first half and the last half of the stream.
Shared by the proc and docker executors; public API for third-party executors.
"""

from __future__ import annotations

import base64
import hashlib
from collections import deque

from policy_engine.model import Digest

TRUNCATION_MARK = b"\n[... %d bytes truncated ...]\n"


class HeadTail:
    """Keeps at most ``limit`` bytes: the first ``ceil(limit/2)`` and the last ``floor(limit/2)``.

    :param limit: bytes kept in total (head + tail); 0 keeps nothing but still counts and
        digests the stream.
    """

    __slots__ = ("_sha", "_tail", "_tail_len", "head", "head_limit", "limit", "tail_limit",
                 "total")

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.head_limit = self.limit - self.limit // 2
        self.tail_limit = self.limit // 2
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.total = 0
        self._sha = hashlib.sha256()

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._sha.update(chunk)
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

    def kept(self, *, mark: bool = True) -> bytes:
        """Head and tail; when truncated and ``mark``, a one-line marker says how much was
        dropped (the marker is not counted against ``limit``).
        """
        if not self.truncated:
            return bytes(self.head) + self.tail()
        if not mark:
            return bytes(self.head) + self.tail()
        dropped = self.total - len(self.head) - len(self.tail())
        return bytes(self.head) + TRUNCATION_MARK % dropped + self.tail()

    def digest(self) -> Digest:
        """SHA-256 of the whole stream, including what was not kept."""
        return Digest(b64=base64.b64encode(self._sha.digest()).decode(), size=self.total)

    def digest_fields(self) -> dict[str, object]:
        """``digest().model_dump()``, built directly (no model per stream: a proc call's two)."""
        return {"algo": "sha256", "b64": base64.b64encode(self._sha.digest()).decode(),
                "size": self.total}
