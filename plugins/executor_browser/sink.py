"""A refusing proxy for the browser: whatever Chromium dials by itself lands here, and stops.

The route handler (``navigate.RequestGate``) serves every request a page makes with Playwright's
own fetch, so Chromium's network stack should dial nothing. What it dials anyway (a WebSocket
opened from a worker, TURN over TCP, a preconnect) goes to the browser's proxy: this loopback
listener, owned by the executor, reads the request line, reports it to the session's gate as
blocked and answers ``403``. Nothing is ever forwarded. Owning the port matters: a fixed closed
port (``127.0.0.1:9``) could be taken by anyone on the host, who would then receive the traffic.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

_REFUSAL = (b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 20\r\n"
            b"Connection: close\r\n\r\nrefused by policy.\r\n")
_MAX_LINE = 8192
_IO_TIMEOUT_S = 2.0

# A loopback address of its own: Chromium's resolver rules map every other host (127.0.0.1
# included) to NOTFOUND, so were anything to bypass the proxy it would still reach nothing.
SINK_HOST = "127.77.0.1"

OnRefused = Callable[[str, str], None]


class RefusingProxy:
    """A loopback proxy that forwards nothing and reports each attempt.

    :param on_refused: called with ``(target, method)`` for each request line it refused
        (``CONNECT host:port`` or an absolute URL); must not raise.
    """

    def __init__(self, on_refused: OnRefused) -> None:
        self._on_refused = on_refused
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((SINK_HOST, 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self.refused = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="policy-engine-browser-sink",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{SINK_HOST}:{self.port}"

    def close(self) -> None:
        """Stop accepting; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._refuse, args=(conn,), daemon=True).start()

    def _refuse(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_IO_TIMEOUT_S)
            line = b""
            with contextlib.suppress(OSError):
                while b"\n" not in line and len(line) < _MAX_LINE:
                    chunk = conn.recv(_MAX_LINE)
                    if not chunk:
                        break
                    line += chunk
            method, _, rest = line.split(b"\n", 1)[0].decode("latin-1").strip().partition(" ")
            target = rest.rpartition(" ")[0] or rest
            self.refused += 1
            if method:  # a preconnect that asked for nothing is not worth a report
                self._on_refused(target[:2048], method[:16])
            with contextlib.suppress(OSError):
                conn.sendall(_REFUSAL)
