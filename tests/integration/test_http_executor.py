"""net.http executor against real loopback servers: digests, limits while streaming, errors."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from plugins.executor_http import HttpExecutor, clean_request_headers
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import ExecResult, NetHttpOp, Profile
from tests.integration.servers import Handler, LoopbackServer, endless, http_profile, send

pytestmark = pytest.mark.integration

BODY = b"hello, pinned world\n" * 500


def _ok(h: Handler) -> None:
    send(h, 200, "text/plain; charset=utf-8", BODY,
         {"Set-Cookie": "session=s3cr3t-cookie", "ETag": '"v1"', "X-Internal": "leak"})


def _drip(h: Handler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Length", "100000")
    h.end_headers()
    try:
        for _ in range(200):
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.2)
    except OSError:
        h.server.seen.peer_closed_early.set()


def _silent(h: Handler) -> None:
    time.sleep(4)


def _echo(h: Handler) -> None:
    send(h, 200, "application/json", json.dumps({"len": len(h.body)}).encode())


ROUTES = {
    "/ok": _ok,
    "/drip": _drip,
    "/silent": _silent,
    "/echo": _echo,
    "/html": lambda h: send(h, 200, "text/html", b"<p>" + b"x" * 8 * 1024 * 1024),
    "/huge": endless(),
    "/declared": endless(declare=True),
}


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


@pytest.fixture
def executor() -> Iterator[HttpExecutor]:
    ex = HttpExecutor()
    yield ex
    ex.close()


def run(ex: HttpExecutor, profile: Profile, op: NetHttpOp,
        ctx: ExecContext | None = None) -> tuple[ExecResult, ExecContext]:
    ctx = ctx or ExecContext(profile=profile, deadline=time.monotonic() + 60)
    return ex.execute(ctx, op), ctx


def refused(ex: HttpExecutor, profile: Profile, op: NetHttpOp) -> tuple[ErrorCode, ExecContext]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    with pytest.raises(PolicyEngineError) as info:
        ex.execute(ctx, op)
    return info.value.code, ctx


def test_allowed_get_returns_digest_head_and_safe_headers(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,))
    op = NetHttpOp(url=server.url("/ok?token=abc123"),
                   headers={"Authorization": "Bearer top-secret", "Accept": "text/plain"})
    result, ctx = run(executor, profile, op)
    out: dict[str, Any] = result.out
    assert out["status"] == 200
    digest = out["body"]["digest"]
    assert digest["b64"] == base64.b64encode(hashlib.sha256(BODY).digest()).decode()
    assert digest["size"] == len(BODY)
    assert base64.b64decode(out["body"]["head_b64"]) == BODY[:4096]
    assert out["body"]["truncated"] is True
    assert out["headers"]["etag"] == '"v1"'
    assert "set-cookie" not in out["headers"]
    assert "x-internal" not in out["headers"]
    assert result.used.bytes_in == len(BODY)
    assert result.used.bytes_out == 0
    (effect,) = ctx.side_effects
    assert effect.meta["url"] == f"http://127.0.0.1:{server.port}/ok"
    assert effect.meta["status"] == 200
    assert effect.meta["bytes_in"] == len(BODY)
    evidence = json.dumps([e.model_dump(mode="json") for e in ctx.side_effects]) + json.dumps(out)
    for secret in ("top-secret", "abc123", "s3cr3t-cookie"):
        assert secret not in evidence
    # the server did get what was asked, over the vetted address
    method, path, headers = server.seen.requests[0]
    assert (method, path) == ("GET", "/ok?token=abc123")
    assert headers["Host"] == f"127.0.0.1:{server.port}"
    assert headers["Accept-Encoding"] == "identity"


def test_request_headers_hop_by_hop_and_host_override_refused(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    """The guard refuses hop-by-hop headers and a Host override before anything is sent; the
    executor's own cleaning (its second line) still drops hop-by-hop headers it is handed."""
    profile = http_profile("127.0.0.1", ports=(server.port,))
    run(executor, profile, NetHttpOp(url=server.url("/ok"), headers={"X-Kept": "yes"}))
    _, _, headers = server.seen.requests[0]
    assert "x-kept" in {k.lower() for k in headers}
    for bad in ({"Connection": "X-Named"}, {"Upgrade": "h2c"}, {"TE": "trailers"},
                {"Proxy-Authorization": "Basic Zm9vOmJhcg=="}, {"Host": "evil.example"}):
        code, _ = refused(executor, profile, NetHttpOp(url=server.url("/ok"), headers=bad))
        assert code is ErrorCode.CAPABILITY_BLOCKED
    assert len(server.seen.requests) == 1
    cleaned = {k.lower() for k, _ in clean_request_headers({
        "Connection": "X-Named", "X-Named": "1", "Upgrade": "h2c", "TE": "trailers",
        "Proxy-Authorization": "Basic Zm9vOmJhcg==", "X-Kept": "yes"})}
    assert "x-kept" in cleaned
    assert not cleaned & {"x-named", "upgrade", "te", "proxy-authorization", "connection"}


def test_request_body_over_max_bytes_out_is_refused_before_sending(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), max_bytes_out=1000)
    small = NetHttpOp(method="POST", url=server.url("/echo"),
                      body_b64=base64.b64encode(b"a" * 1000).decode())
    result, _ = run(executor, profile, small)
    assert json.loads(base64.b64decode(result.out["body"]["head_b64"])) == {"len": 1000}
    assert result.used.bytes_out == 1000
    big = small.model_copy(update={"body_b64": base64.b64encode(b"a" * 1001).decode()})
    code, _ = refused(executor, profile, big)
    assert code is ErrorCode.CAPABILITY_BLOCKED
    assert len(server.seen.requests) == 1


def test_oversize_streamed_body_is_cut_off_with_bounded_memory(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    """A 10 GB body without Content-Length: cut at max_bytes_in, connection closed, never
    buffered (tracemalloc peak far below the limit), and the server sees the hang-up."""
    limit = 4 * 1024 * 1024
    profile = http_profile("127.0.0.1", ports=(server.port,), max_bytes_in=limit)
    tracemalloc.start()
    try:
        code, ctx = refused(executor, profile, NetHttpOp(url=server.url("/huge")))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code is ErrorCode.CAPABILITY_BLOCKED
    assert peak < 2 * 1024 * 1024, peak
    assert ctx.usage.bytes_in <= limit + 128 * 1024
    assert ctx.side_effects[-1].meta["refused"] == ErrorCode.CAPABILITY_BLOCKED.value
    assert server.seen.peer_closed_early.wait(30), "server never saw the connection close"
    assert server.seen.bytes_sent < 64 * 1024 * 1024


def test_declared_oversize_body_is_refused_without_reading(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), max_bytes_in=1024 * 1024)
    code, ctx = refused(executor, profile, NetHttpOp(url=server.url("/declared")))
    assert code is ErrorCode.CAPABILITY_BLOCKED
    assert ctx.usage.bytes_in == 0
    assert server.seen.peer_closed_early.wait(30)


def test_wrong_mime_is_refused_and_body_not_read(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), mime=("application/json",))
    code, ctx = refused(executor, profile, NetHttpOp(url=server.url("/html")))
    assert code is ErrorCode.CAPABILITY_BLOCKED
    assert ctx.usage.bytes_in == 0
    assert ctx.side_effects[-1].meta["status"] == 200
    result, _ = run(executor, profile, NetHttpOp(url=server.url("/echo")))
    assert result.out["headers"]["content-type"] == "application/json"


def test_slow_drip_times_out_on_the_total_deadline(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    """Each byte arrives well within a read timeout; only the call's deadline catches it."""
    profile = http_profile("127.0.0.1", ports=(server.port,), timeout_ms=1000)
    started = time.monotonic()
    code, _ = refused(executor, profile, NetHttpOp(url=server.url("/drip")))
    assert code is ErrorCode.TIMEOUT
    assert time.monotonic() - started < 8


def test_silent_server_times_out(server: LoopbackServer, executor: HttpExecutor) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), timeout_ms=800)
    started = time.monotonic()
    code, _ = refused(executor, profile, NetHttpOp(url=server.url("/silent")))
    assert code is ErrorCode.TIMEOUT
    assert time.monotonic() - started < 8


def test_connection_refused_is_provider_unavailable(executor: HttpExecutor) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile = http_profile("127.0.0.1", ports=(port,))
    code, ctx = refused(executor, profile, NetHttpOp(url=f"http://127.0.0.1:{port}/x"))
    assert code is ErrorCode.PROVIDER_UNAVAILABLE
    assert ctx.side_effects[-1].meta["refused"] == ErrorCode.PROVIDER_UNAVAILABLE.value


def test_unresolvable_name_is_provider_unavailable() -> None:
    """The resolver stands in for DNS (no DNS server exists here): it raises like getaddrinfo."""
    def no_such_host(host: str, port: int) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    ex = HttpExecutor(resolver=no_such_host)
    try:
        profile = http_profile("api.example.test", ports=(8080,))
        code, _ = refused(ex, profile, NetHttpOp(url="http://api.example.test:8080/"))
    finally:
        ex.close()
    assert code is ErrorCode.PROVIDER_UNAVAILABLE


def test_guard_refusal_of_the_request_itself(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), methods=("GET",))
    code, _ = refused(executor, profile, NetHttpOp(method="DELETE", url=server.url("/ok")))
    assert code in (ErrorCode.PERMISSION_DENY, ErrorCode.CAPABILITY_BLOCKED)
    code, _ = refused(executor, profile, NetHttpOp(url=server.url("/ok").replace(
        "http://", "http://user:pw@")))
    assert code is ErrorCode.CAPABILITY_BLOCKED
    assert server.seen.requests == []


def test_head_of_a_large_declared_body_is_not_refused(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,), max_bytes_in=1024)
    result, _ = run(executor, profile, NetHttpOp(method="HEAD", url=server.url("/html")))
    assert result.out["status"] == 200
    assert result.out["body"]["digest"]["size"] == 0


def test_header_injection_is_a_validation_error(
    server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile = http_profile("127.0.0.1", ports=(server.port,))
    # U+0085 (NEL), U+2028 (line separator) and U+00FF: a client would encode them some way
    # (or crash, which was TOOL.EXECUTION_FAILED); the executor refuses them as invalid input
    bad = ({"X-A": "v\r\nX-Injected: 1"}, {"Bad Name": "v"}, {"X-A": "a\u0085b"},
           {"X-A": "a\u2028b"}, {"X-A": "caf\u00ff"}, {"X-\u00ff": "v"})
    for headers in bad:
        code, _ = refused(executor, profile, NetHttpOp(url=server.url("/ok"), headers=headers))
        assert code is ErrorCode.SCHEMA_VALIDATION_FAILED, headers
    assert server.seen.requests == []


def test_plugin_hook_validates_options_then_builds_the_executor() -> None:
    from plugins.executor_http.plugin import policy_engine_executors
    from policy_engine.config import EngineConfig
    from policy_engine.executor import Executor

    (ex,) = policy_engine_executors(EngineConfig(options={"http": {"head_bytes": 16}}))
    try:
        assert isinstance(ex, Executor)
        assert ex.name == "http"
        assert ex.capabilities.to_json()["op_kinds"] == ["net.http"]
    finally:
        ex.close()
    for bad in ({"head_bytes": -1}, {"nope": 1}, {"ca_file": 3}):
        with pytest.raises(ValueError, match="`"):
            policy_engine_executors(EngineConfig(options={"http": bad}))
