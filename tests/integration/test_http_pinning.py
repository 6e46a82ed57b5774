"""net.http: every redirect hop re-decided, names resolved once, vetted addresses dialed."""

from __future__ import annotations

import base64
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_http import HttpExecutor
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import ExecResult, NetHttpOp, Profile
from tests.integration.servers import (
    Handler,
    LoopbackServer,
    client_tls,
    http_profile,
    redirect,
    self_signed,
    send,
)

pytestmark = pytest.mark.integration

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _echo(h: Handler) -> None:
    info = {"method": h.command, "body": h.body.decode(), "auth": h.headers.get("Authorization")}
    send(h, 200, "application/json", json.dumps(info).encode())


def execute(ex: HttpExecutor, profile: Profile, op: NetHttpOp) -> tuple[ExecResult, ExecContext]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    return ex.execute(ctx, op), ctx


def refusal(ex: HttpExecutor, profile: Profile,
            op: NetHttpOp) -> tuple[PolicyEngineError, ExecContext]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    with pytest.raises(PolicyEngineError) as info:
        ex.execute(ctx, op)
    return info.value, ctx


def head_json(result: ExecResult) -> Any:
    return json.loads(base64.b64decode(result.out["body"]["head_b64"]))


@pytest.fixture
def executor() -> Iterator[HttpExecutor]:
    ex = HttpExecutor()
    yield ex
    ex.close()


def test_redirect_to_a_forbidden_address_is_refused_before_dialing(executor: HttpExecutor) -> None:
    with LoopbackServer({"/echo": _echo}, host="127.0.0.2") as other, \
            LoopbackServer({}) as origin:
        origin.httpd.routes["/go"] = redirect(other.url("/echo"))
        origin.httpd.routes["/meta"] = redirect("http://169.254.169.254/latest/meta-data/")
        # `*` admits any host but names no address: loopback 127.0.0.2 and metadata stay refused
        profile = http_profile("127.0.0.1", "*", ports=(origin.port, other.port, 80))
        for path in ("/go", "/meta"):
            err, ctx = refusal(executor, profile, NetHttpOp(url=origin.url(path)))
            assert err.code is ErrorCode.CAPABILITY_BLOCKED, err
            assert "redirect" in err.reason
            first, last = ctx.side_effects
            assert first.meta["status"] == 302
            assert "refused" not in first.meta
            assert last.meta["refused"] == ErrorCode.CAPABILITY_BLOCKED.value
        assert other.seen.requests == []


def test_redirect_to_a_host_no_rule_admits_is_refused(executor: HttpExecutor) -> None:
    with LoopbackServer({"/go": redirect("http://elsewhere.example/")}) as origin:
        profile = http_profile("127.0.0.1", ports=(origin.port,))
        err, _ = refusal(executor, profile, NetHttpOp(url=origin.url("/go")))
        assert err.code in (ErrorCode.PERMISSION_DENY, ErrorCode.CAPABILITY_BLOCKED)


def test_allowed_redirects_follow_method_rules_and_drop_credentials_cross_origin(
    executor: HttpExecutor,
) -> None:
    with LoopbackServer({"/echo": _echo}, host="127.0.0.2") as other, \
            LoopbackServer({"/echo": _echo}) as origin:
        origin.httpd.routes.update({
            "/303": redirect("/echo", 303),
            "/307": redirect("/echo", 307),
            "/away": redirect(other.url("/echo"), 307),
        })
        profile = http_profile("127.0.0.1", "127.0.0.2", ports=(origin.port, other.port))
        body = base64.b64encode(b"payload").decode()
        auth = {"Authorization": "Bearer hop-secret"}
        r303, _ = execute(executor, profile, NetHttpOp(
            method="POST", url=origin.url("/303"), body_b64=body, headers=auth))
        assert head_json(r303) == {"method": "GET", "body": "", "auth": "Bearer hop-secret"}
        r307, ctx = execute(executor, profile, NetHttpOp(
            method="POST", url=origin.url("/307"), body_b64=body, headers=auth))
        assert head_json(r307)["method"] == "POST"
        assert head_json(r307)["body"] == "payload"
        assert r307.out["redirects"] == 1
        assert r307.used.bytes_out == 14
        assert [e.meta["status"] for e in ctx.side_effects] == [307, 200]
        away, _ = execute(executor, profile, NetHttpOp(
            method="POST", url=origin.url("/away"), body_b64=body, headers=auth))
        assert head_json(away) == {"method": "POST", "body": "payload", "auth": None}


def test_redirect_loop_exceeds_max_depth(executor: HttpExecutor) -> None:
    with LoopbackServer({"/loop": redirect("/loop?again=1")}) as origin:
        profile = http_profile("127.0.0.1", ports=(origin.port,), max_depth=3)
        err, ctx = refusal(executor, profile, NetHttpOp(url=origin.url("/loop")))
        assert err.code is ErrorCode.CAPABILITY_BLOCKED
        assert "max_depth" in err.reason
        assert len(origin.seen.requests) == 4  # the request and three redirects, no more
        assert all("again" not in str(e.meta) for e in ctx.side_effects)


def test_a_name_resolving_to_loopback_is_refused() -> None:
    """Real resolution (getaddrinfo reads /etc/hosts): `localhost` is loopback, and the rule
    `*` admits the name without naming the address, so nothing is dialed."""
    ex = HttpExecutor()
    try:
        with LoopbackServer({"/echo": _echo}) as srv:
            profile = http_profile("*", ports=(srv.port,))
            err, _ = refusal(ex, profile, NetHttpOp(url=srv.url("/echo", host="localhost")))
            assert err.code is ErrorCode.CAPABILITY_BLOCKED
            assert "loopback" in err.reason
            assert srv.seen.requests == []
            # naming the host explicitly lifts the refusal (DESIGN.md §3)
            ok, _ = execute(ex, http_profile("localhost", ports=(srv.port,)),
                            NetHttpOp(url=srv.url("/echo", host="localhost")))
            assert ok.out["status"] == 200
    finally:
        ex.close()


def _same_port_pair() -> tuple[LoopbackServer, LoopbackServer]:
    for _ in range(50):
        good = LoopbackServer({"/who": lambda h: send(h, 200, "text/plain", b"vetted")},
                              host="127.0.0.2")
        try:
            bad = LoopbackServer({"/who": lambda h: send(h, 200, "text/plain", b"REBOUND")},
                                 host="127.0.0.1", port=good.port)
        except OSError:
            good.httpd.server_close()
            continue
        return good, bad
    raise RuntimeError("no port free on both 127.0.0.1 and 127.0.0.2")


def test_dns_rebinding_cannot_switch_the_dialed_address() -> None:
    """A resolver stub stands in for DNS (no DNS server runs here): it answers an allowed
    address (127.0.0.2: loopback, the name is named exactly by the rule) the first time and
    the metadata address after. 127.0.0.1 serves the same port, so a client dialing anything
    but the vetted address would reach the wrong server; the executor resolves once and dials
    the vetted address, and the next hop's answer is vetted again (metadata: never through a
    name, so it is refused before any connection)."""
    calls: list[str] = []
    lock = threading.Lock()

    def rebinding(host: str, port: int) -> list[IP]:
        with lock:
            calls.append(host)
            first = len(calls) == 1
        return [ipaddress.ip_address("127.0.0.2" if first else "169.254.169.254")]

    good, bad = _same_port_pair()
    ex = HttpExecutor(resolver=rebinding)
    try:
        with good, bad:
            good.httpd.routes["/again"] = redirect("/who")
            profile = http_profile("www.rebind.test", ports=(good.port,))
            url = f"http://www.rebind.test:{good.port}"
            result, ctx = execute(ex, profile, NetHttpOp(url=url + "/who"))
            assert base64.b64decode(result.out["body"]["head_b64"]) == b"vetted"
            assert calls == ["www.rebind.test"]
            assert ctx.side_effects[0].meta["address"] == "127.0.0.2"
            assert good.seen.requests[0][2]["Host"] == f"www.rebind.test:{good.port}"
            # each redirect hop resolves again, and that answer is vetted again: refused
            err, _ = refusal(ex, profile, NetHttpOp(url=url + "/again"))
            assert err.code is ErrorCode.CAPABILITY_BLOCKED
            assert "metadata" in err.reason
            assert bad.seen.requests == []
    finally:
        ex.close()


def test_a_name_with_one_forbidden_address_among_several_is_refused() -> None:
    def mixed(host: str, port: int) -> list[IP]:
        return [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.0.0.7")]

    ex = HttpExecutor(resolver=mixed)
    try:
        err, _ = refusal(ex, http_profile("*.example.test", ports=(80,)),
                         NetHttpOp(url="http://a.example.test/"))
        assert err.code is ErrorCode.CAPABILITY_BLOCKED
        assert "public and non-public" in err.reason
    finally:
        ex.close()


def test_https_dials_the_vetted_address_with_the_name_as_sni(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, names=("localhost",), ips=())
    names: list[str | None] = []
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    tls.sni_callback = lambda sock, name, ctx: names.append(name)  # type: ignore[assignment,misc,return-value]  # records only

    def only_v4(host: str, port: int) -> list[IP]:
        return [ipaddress.ip_address(i[4][0]) for i in socket.getaddrinfo(
            host, port, socket.AF_INET, socket.SOCK_STREAM)]

    ex = HttpExecutor(verify=client_tls(cert), resolver=only_v4)
    try:
        with LoopbackServer({"/echo": _echo}, tls=tls) as srv:
            profile = http_profile("localhost", ports=(srv.port,))
            result, ctx = execute(ex, profile, NetHttpOp(url=srv.url("/echo", host="localhost")))
            assert result.out["status"] == 200
            assert names == ["localhost"]
            assert ctx.side_effects[0].meta["address"] == "127.0.0.1"
            # the certificate names `localhost` only: the IP literal fails verification
            err, _ = refusal(ex, http_profile("127.0.0.1", ports=(srv.port,)),
                             NetHttpOp(url=srv.url("/echo")))
            assert err.code is ErrorCode.PROVIDER_UNAVAILABLE
    finally:
        ex.close()
