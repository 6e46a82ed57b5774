"""The loopback test servers stay quiet when a client hangs up: other tests capture stderr."""

from __future__ import annotations

import socket
import time

import pytest

from tests.integration.servers import Handler, LoopbackServer, send


def _late(h: Handler) -> None:
    time.sleep(0.3)  # the client has gone by now
    send(h, 200, "text/plain", b"x" * 4 * 1024 * 1024)


def test_a_client_that_hangs_up_early_leaves_no_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a handler thread's traceback lands in whichever test's stderr capture runs at the time
    # (CI once saw a conformance server's BrokenPipeError inside a CLI test's output)
    with LoopbackServer({"/late": _late}) as srv:
        with socket.create_connection((srv.host, srv.port)) as c:
            c.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        assert srv.seen.peer_closed_early.wait(5)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert "Broken pipe" not in err, err
