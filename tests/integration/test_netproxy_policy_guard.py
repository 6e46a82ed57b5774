"""The restricted-mode proxy under a real compiled policy: the guard it is given decides.

Requests are written to the proxy's Unix socket directly (what the in-sandbox bridge forwards);
the sandboxed paths are covered by ``test_netproxy.py`` and the docker tests.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_engine.errors import ErrorCode
from policy_engine.guard import Guard
from policy_engine.model import NetHttpCapability, NetHttpOp, Profile
from policy_engine.netproxy import RestrictedHandle, RestrictedNetwork
from tests.integration.servers import LoopbackServer, compiled_profile, send

pytestmark = pytest.mark.integration

ROUTES = {
    "/ok/page": lambda h: send(h, 200, "text/plain", b"allowed page"),
    "/nope": lambda h: send(h, 200, "text/plain", b"must never be served"),
}


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


def policy(tmp: Path, port: int) -> tuple[Profile, Guard]:
    rules = (f'permit "ok-paths" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{port}]\n'
             '  methods ["GET"] when `request.path.startsWith("/ok")`')
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,),
                            methods=("GET",))
    return compiled_profile(tmp, rules, (cap,), network="restricted")


def proxied_get(net: RestrictedHandle, url: str) -> tuple[int, dict[str, str], bytes]:
    """One ``GET`` through the proxy socket; (status, headers, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(net.socket_path))
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_proxy_decides_with_the_policy_guard_it_was_given(
    tmp_path: Path, server: LoopbackServer
) -> None:
    profile, guard = policy(tmp_path, server.port)
    expected = guard.decide(profile, NetHttpOp(url=server.url("/nope")))
    assert not expected.allowed
    with RestrictedNetwork(profile, guard).start() as net:
        status, _h, body = proxied_get(net, server.url("/ok/page"))
        assert (status, body) == (200, b"allowed page")
        status, headers, _b = proxied_get(net, server.url("/nope"))
        assert status == 403
        assert headers["X-Policy-Engine-Code"] == expected.code
        (refusal,) = net.refusals()
        assert refusal.meta["refused"] == expected.code
        assert refusal.meta["url"] == f"http://127.0.0.1:{server.port}/nope"
    assert [p for _m, p, _h in server.seen.requests] == ["/ok/page"]


def test_proxy_without_the_policy_guard_fails_closed(
    tmp_path: Path, server: LoopbackServer
) -> None:
    profile, _guard = policy(tmp_path, server.port)
    with RestrictedNetwork(profile).start() as net:  # Guard() cannot evaluate the condition
        status, headers, _b = proxied_get(net, server.url("/ok/page"))
        assert status == 403
        assert headers["X-Policy-Engine-Code"] == ErrorCode.PERMISSION_DENY.value
    assert server.seen.requests == []


def test_a_proxied_post_with_a_body_passes_the_header_checks(
    tmp_path: Path, server: LoopbackServer
) -> None:
    """The client's Content-Length (and Host, Connection) belong to its hop to the proxy: the
    op the guard decides carries the body, not those headers, so the header refusal of
    `Content-Length` does not refuse every proxied request with a body."""
    rules = (f'permit "post" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{server.port}]'
             '  methods ["POST"]')
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(server.port,),
                            methods=("POST",))
    profile, guard = compiled_profile(tmp_path, rules, (cap,), network="restricted")
    with RestrictedNetwork(profile, guard).start() as net, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(net.socket_path))
        s.sendall((f"POST {server.url('/ok/page')} HTTP/1.1\r\nHost: x\r\n"
                   "Content-Length: 5\r\nConnection: close\r\n\r\nhello").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.split(b" ", 2)[1] == b"200", data[:200]
    assert [m for m, _p, _h in server.seen.requests] == ["POST"]
