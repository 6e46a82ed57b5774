"""`policy-engine serve` sends each answer in one segment (service/coalesce.py, issue 27 item 3).

uvicorn's h11 cycle wrote the status line and headers, then the body: two segments per answer
with ``TCP_NODELAY`` on, each costing the server a loopback delivery. The integration test
counts the segments a keep-alive client receives per answer from a real server (the kernel's
``tcpi_segs_in`` of the client's socket, not a timing); the unit tests hold the joining
transport to the bytes, order, close and abort of the one it wraps.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
from io import BufferedReader
from pathlib import Path
from typing import Any

import pytest

from policy_engine.service.coalesce import JOIN_BYTES, JoinedWrites
from tests.integration.service_server import add_token, grant, start

pytestmark = pytest.mark.integration

_SEGS_IN = 140  # struct tcp_info: tcpi_segs_out at 136, tcpi_segs_in at 140 (Linux 4.2+)


def _segs_in(conn: socket.socket) -> int:
    info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("I", info, _SEGS_IN)[0])


def _exchange(conn: socket.socket, reader: BufferedReader, raw: bytes) -> bytes:
    conn.sendall(raw)
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += reader.readline()
    length = re.search(rb"content-length: (\d+)", head, re.I)
    assert length is not None, head
    return head + reader.read(int(length.group(1)))


def test_each_answer_reaches_the_client_in_one_segment(tmp_path: Path) -> None:
    with start(tmp_path, "--rate-per-minute", "100000") as svc:
        token = add_token(svc.state, "acme", "agent:a")
        body = json.dumps({"op": {"kind": "fs.read", "path": f"{tmp_path}/data/hello.txt"},
                           "grant": grant("acme", "agent:a", tmp_path),
                           "manifest": "reader"}).encode()
        host, port = svc.url.removeprefix("http://").split(":")
        per_answer = []
        with socket.create_connection((host, int(port))) as conn:
            reader = conn.makefile("rb")
            for path in ("/v1/ops", "/v1/decide", "/sandbox/health") * 8:
                raw = (f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n"
                       f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                       "\r\n").encode() + body if path != "/sandbox/health" else \
                    f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode()
                before = _segs_in(conn)
                answer = _exchange(conn, reader, raw)
                assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
                assert b'{"result":{"ok":true' in answer or path != "/v1/ops"
                per_answer.append((path, _segs_in(conn) - before))
        # an early answer can come after a pure ACK (the kernel's quick-ACK start): the fewest
        # per route is what the server writes; two writes made it at least two
        for route in ("/v1/ops", "/v1/decide", "/sandbox/health"):
            assert min(n for p, n in per_answer if p == route) == 1, per_answer


class _Inner(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_one_turns_writes_go_out_once_in_order_and_before_a_close() -> None:
    async def scenario() -> _Inner:
        inner = _Inner()
        joined = JoinedWrites(inner, asyncio.get_running_loop())
        joined.write(b"HTTP/1.1 200 OK\r\n\r\n")
        joined.write(b"")
        joined.writelines([bytearray(b"body"), memoryview(b"!")])
        assert inner.writes == []
        assert joined.get_write_buffer_size() == 24
        await asyncio.sleep(0)
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody!"]
        joined.write(b"second")
        await asyncio.sleep(0)
        joined.write(b"last")
        joined.close()  # what is kept is sent before the close
        await asyncio.sleep(0)
        assert inner.closed
        return inner

    inner = asyncio.run(scenario())
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody!", b"second", b"last"]


def test_an_abort_drops_what_is_kept_and_nothing_is_sent_after_it() -> None:
    async def scenario() -> _Inner:
        inner = _Inner()
        joined = JoinedWrites(inner, asyncio.get_running_loop())
        joined.write(b"never")
        joined.abort()
        joined.write(b"after")
        await asyncio.sleep(0)
        return inner

    inner = asyncio.run(scenario())
    assert inner.aborted
    assert inner.writes == []


def test_a_long_stream_is_passed_on_within_the_turn_at_the_bound() -> None:
    """A streamed answer whose chunks come without a pause is not kept without bound: past
    ``JOIN_BYTES`` it reaches the real transport at once (whose flow control then holds the
    writer)."""
    async def scenario() -> _Inner:
        inner = _Inner()
        joined = JoinedWrites(inner, asyncio.get_running_loop())
        chunk = b"x" * 1000
        for _ in range(JOIN_BYTES // len(chunk) + 1):
            joined.write(chunk)
        assert len(inner.writes) == 1
        assert len(inner.writes[0]) >= JOIN_BYTES
        assert joined.get_write_buffer_size() == 0
        joined.write(b"tail")
        await asyncio.sleep(0)
        return inner

    inner = asyncio.run(scenario())
    assert b"".join(inner.writes) == b"x" * 1000 * (JOIN_BYTES // 1000 + 1) + b"tail"
