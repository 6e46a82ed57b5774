"""One HTTP/1.1 POST whose whole exchange (resolve, connect, TLS, request, status, headers,
body) ends by a deadline — the webhook approver's transport (issue 32 item 7).

An HTTP client's timeouts bound each socket operation, so a peer that sends one byte just
inside each of them holds the caller for as long as it likes. Here every operation waits
only for what is left of one deadline, and the answer is bounded in bytes. h11 (the HTTP/1.1
parser httpx itself is built on) does the parsing; no proxy is used: the approver is reached
directly.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11

MAX_ANSWER_BYTES = 64 * 1024


class DeadlineExceeded(Exception):
    """The exchange did not end by the deadline."""


@dataclass(frozen=True, slots=True)
class Answer:
    status_code: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    content: bytes


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded
    return left


_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]


def _resolve(host: str, port: int, deadline: float) -> list[_AddrInfo]:
    """``getaddrinfo`` bounded by the deadline (it has no timeout of its own; a resolver that
    hangs leaves a daemon thread behind, never the caller)."""
    found: list[list[_AddrInfo]] = []
    failed: list[OSError] = []

    def run() -> None:
        try:
            found.append(list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
        except OSError as exc:
            failed.append(exc)

    worker = threading.Thread(target=run, daemon=True, name="approver-resolve")
    worker.start()
    worker.join(_left(deadline))
    if failed:
        raise failed[0]
    if not found:
        raise DeadlineExceeded
    return found[0]


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    last: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _, addr in _resolve(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(addr)
            return sock
        except TimeoutError:
            sock.close()
            raise DeadlineExceeded from None
        except OSError as exc:
            sock.close()
            last = exc
    raise last


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> Answer:
    """POST ``body`` to ``url`` (http or https) and read the whole answer within
    ``timeout_s`` seconds.

    :raises DeadlineExceeded: the answer was not complete in time (the connection is closed).
    :raises OSError: the approver could not be reached or broke the connection.
    :raises ValueError: the URL or the answer is not usable HTTP/1.1 (or is over 64 KiB).
    """
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the approver URL must be http(s)://host[:port]/path")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    sock = _connect(parts.hostname, port, deadline)
    try:
        if parts.scheme == "https":
            sock.settimeout(_left(deadline))
            sock = ssl.create_default_context().wrap_socket(sock,
                                                            server_hostname=parts.hostname)
        return _exchange(sock, parts.hostname, port, parts.path or "/", parts.query, body,
                         headers, deadline)
    except TimeoutError:
        raise DeadlineExceeded from None
    finally:
        sock.close()


def _exchange(sock: socket.socket, host: str, port: int, path: str, query: str, body: bytes,
              headers: dict[str, str], deadline: float) -> Answer:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_ANSWER_BYTES)
    target = path + (f"?{query}" if query else "")
    fields = [("host", f"{host}:{port}"), ("content-length", str(len(body))),
              ("connection", "close"), *headers.items()]
    out = conn.send(h11.Request(method="POST", target=target, headers=fields))
    out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
    sock.settimeout(_left(deadline))
    sock.sendall(out)  # since 3.5 the timeout bounds the whole sendall
    status, got, content = 0, {}, bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise ValueError(f"the answer is not HTTP/1.1 ({exc})") from None
        if event is h11.NEED_DATA:
            sock.settimeout(_left(deadline))
            conn.receive_data(sock.recv(16384))
        elif isinstance(event, h11.Response):
            status = event.status_code
            got = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        elif isinstance(event, h11.Data):
            content += event.data
            if len(content) > MAX_ANSWER_BYTES:
                raise ValueError(f"the answer is over {MAX_ANSWER_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return Answer(status, got, bytes(content))
        elif isinstance(event, h11.ConnectionClosed):
            raise OSError("the approver closed the connection before its answer ended")
        # h11.InformationalResponse (1xx) is skipped: the final answer follows
