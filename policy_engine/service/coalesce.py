"""uvicorn's h11 protocol with each answer's writes joined: one ``send`` per response.

uvicorn's h11 cycle writes a response's status line and headers as soon as the app sends
``http.response.start``, then its body on ``http.response.body``: two ``send`` system calls per
answer. With ``TCP_NODELAY`` on (``listen.py``) each is a segment of its own, and on loopback
the kernel delivers a segment, and wakes the reader, inside the sender's system call: the
second write costs the server about as much CPU as the first (docs/benchmarks.md, "Thirteenth
pass: ops, second round"). The transport the protocol writes to here keeps what one turn of the
event loop writes and sends it at the end of that turn (``loop.call_soon``) in one call: the
same bytes in the same order, sent before the loop waits for anything (the next ready callback
runs first, then the selector); a close sends what is kept first; past ``JOIN_BYTES`` kept
(a streamed answer) they are passed on at once, so the real transport's flow control
(``pause_writing``) holds a fast producer as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

JOIN_BYTES = 64 * 1024
"""Bytes kept at most before they are passed on within the turn (a streamed answer)."""


class JoinedWrites(asyncio.Transport):
    """A transport that passes one event-loop turn's writes to ``inner`` as one write."""

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = inner
        self._loop = loop
        self._kept: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._kept:
            self._loop.call_soon(self._send)
        self._kept.append(data if type(data) is bytes else bytes(data))  # a view may change
        self._size += len(data)
        if self._size >= JOIN_BYTES:
            # a streamed answer whose chunks come without a pause: passed on now, so the real
            # transport's flow control (``pause_writing``) sees them and holds the writer
            self._send()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _send(self) -> None:
        kept, self._kept, self._size = self._kept, [], 0
        if kept and not self._inner.is_closing():
            self._inner.write(kept[0] if len(kept) == 1 else b"".join(kept))

    def close(self) -> None:
        self._send()
        self._inner.close()

    def abort(self) -> None:
        self._kept, self._size = [], 0
        self._inner.abort()

    def write_eof(self) -> None:
        self._send()
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)


class JoinedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol writing through :class:`JoinedWrites` (``uvicorn.Config(http=)``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # INVARIANT: a TCP or Unix stream
        super().connection_made(JoinedWrites(transport, self.loop))
