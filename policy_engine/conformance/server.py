"""The kit's loopback HTTP server: a page holding a secret and a page that never finishes.

It listens on 127.0.0.1 only and every response loop is bounded in time, so a probe can never
send traffic anywhere else or keep a thread alive past the suite.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The slow page drips one byte per interval for at most this long, then ends the connection:
# far longer than the kit's probe timeouts, short enough to bound a run that ignores them.
SLOW_FOR_S = 30.0
_DRIP_S = 0.05


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return  # requests are counted in ProbeServer.requests, not printed

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        path = self.path.split("?", 1)[0]
        with self.server.lock:
            self.server.requests.append((self.command, path))
        if path == "/hello":
            body = f"conformance page; secret={self.server.secret}\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path == "/slow":
            self._drip()
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        end = time.monotonic() + SLOW_FOR_S
        try:
            while time.monotonic() < end and not self.server.stopping.is_set():
                self.wfile.write(b".")
                self.wfile.flush()
                time.sleep(_DRIP_S)
        except OSError:
            return  # the client gave up: what a well-behaved executor does on timeout


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    secret = ""
    requests: list[tuple[str, str]]
    lock: threading.Lock
    stopping: threading.Event


class ProbeServer:
    """A started loopback server; use as a context manager or call ``close``."""

    def __init__(self, secret: str) -> None:
        self._srv = _Server(("127.0.0.1", 0), _Handler)
        self._srv.secret = secret
        self._srv.requests = []
        self._srv.lock = threading.Lock()
        self._srv.stopping = threading.Event()
        self.port: int = self._srv.server_address[1]
        self._thread = threading.Thread(target=self._srv.serve_forever,
                                        name="policy-engine-conformance-http", daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self._srv.lock:
            return list(self._srv.requests)

    def close(self) -> None:
        self._srv.stopping.set()
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ProbeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

