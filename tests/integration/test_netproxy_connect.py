"""Restricted network: a CONNECT tunnel carries only what the matched rule allows, and every byte
through the proxy (tunnels included, both directions) counts against ``bytes_in``/``bytes_out``.

Real sandboxes (proc-bwrap, docker run-once), a real compiled policy, real loopback servers; the
sandboxed program talks to the proxy with raw sockets, as an attacker would (REPRO.md F2).
The last test resolves through a real DNS server on a loopback port (REPRO.md F10).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.errors import ErrorCode
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.model import NetHttpCapability, ProcExecOp, Profile, SideEffect
from policy_engine.netproxy import RestrictedNetwork
from tests.integration.servers import (
    Handler,
    LoopbackServer,
    compiled_profile,
    self_signed,
    send,
    server_tls,
)
from tests.integration.test_netproxy import sandboxed
from tests.unit.loopback_dns import LoopbackDns

pytestmark = pytest.mark.integration

ALL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MARKER = b"EXFIL-TUNNEL-MARKER-"


def _echo(h: Handler) -> None:
    h.server.seen.requests.append(("BODY", str(len(h.body)), {}))
    send(h, 200, "text/plain", b"echo %d" % len(h.body))


ROUTES = {"/ok": lambda h: send(h, 200, "text/plain", b"ok"), "/echo": _echo}

# Runs inside the sandbox: CONNECT through the proxy, then a 50 KB POST through the tunnel,
# plain (argv[2] == "plain") or inside TLS verified against the PEM in argv[3].
TUNNEL = r"""
import json, os, socket, ssl, sys
proxy = os.environ["http_proxy"][len("http://"):].rstrip("/")
phost, pport = proxy.rsplit(":", 1)
target, mode = sys.argv[1], sys.argv[2]
body = b"EXFIL-TUNNEL-MARKER-" + b"Z" * 50000
out = {}
s = socket.create_connection((phost, int(pport)), timeout=10)
s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    d = s.recv(4096)
    if not d:
        break
    head += d
lines = head.decode("latin-1").split("\r\n")
out["connect"] = lines[0]
out["code"] = next((l.split(":", 1)[1].strip() for l in lines
                    if l.lower().startswith("x-policy-engine-code:")), None)
if " 200 " in lines[0]:
    try:
        if mode == "tls":
            ctx = ssl.create_default_context(cadata=sys.argv[3])
            s = ctx.wrap_socket(s, server_hostname=target.rsplit(":", 1)[0])
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n"
                  % (target.encode(), len(body)) + body)
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
        out["response"] = got.split(b"\r\n", 1)[0].decode("latin-1")
    except (OSError, ssl.SSLError) as e:
        out["error"] = type(e).__name__
print(json.dumps(out))
"""

# Runs inside the sandbox: two plain-HTTP requests to the forward proxy, then a pipelined pair
# on one connection (an allowed GET, then a POST the rule forbids).
FORWARD = r"""
import json, os, socket, sys, urllib.request, urllib.error
proxy = os.environ["http_proxy"][len("http://"):].rstrip("/")
phost, pport = proxy.rsplit(":", 1)
base = sys.argv[1]
out = {}
for name in ("first", "second"):
    req = urllib.request.Request(base + "/echo", data=b"B" * 600, method="POST")
    try:
        out[name] = urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        out[name] = [e.code, e.headers.get("X-Policy-Engine-Code")]
s = socket.create_connection((phost, int(pport)), timeout=10)
s.sendall(f"GET {base}/ok HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n".encode()
          + f"DELETE {base}/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello".encode())
got = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    got += d
out["pipelined"] = got.count(b"HTTP/1.1 ")
s = socket.create_connection((phost, int(pport)), timeout=10)
s.sendall(f"GET {base}/ok HTTP/1.1\r\nHost: x\r\n".encode() + b"X-A: caf\xff\r\n\r\n")
out["non_ascii_header"] = s.recv(4096).split(b"\r\n")[:3][0::2]
out["non_ascii_header"] = [x.decode() for x in out["non_ascii_header"]]
print(json.dumps(out))
"""


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


@pytest.fixture(scope="module")
def bwrap_ex() -> Iterator[ProcExecutor]:
    ex = ProcExecutor("bwrap")
    assert ex.available() is True, ex.unavailable_reason
    yield ex
    ex.close()


def restricted(tmp: Path, port: int, *, methods: tuple[str, ...] = ("GET",),
               schemes: tuple[str, ...] = ("http", "https"),
               limits: str = "bytes_out 1KiB") -> tuple[Profile, Guard]:
    """REPRO F2's policy: one loopback rule, ``bytes_out 1KiB`` for the call."""
    quoted = ", ".join(f'"{m}"' for m in methods)
    scheme_list = ", ".join(f'"{s}"' for s in schemes)
    rules = (f"defaults {{\n  network restricted\n  limits {{ {limits} }}\n}}\n"
             f'permit "loop" net.http hosts ["127.0.0.1"] ports [{port}]\n'
             f"  schemes [{scheme_list}] methods [{quoted}]")
    cap = NetHttpCapability(hosts=("127.0.0.1",), ports=(port,), schemes=schemes,
                            methods=methods)
    return compiled_profile(tmp, rules, (cap,), tool="py", network="restricted")


def run(ex: ProcExecutor | DockerExecutor, profile: Profile, guard: Guard, script: str,
        *args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``script`` in the sandbox; check the budget was charged exactly the bytes the
    proxy's evidence says went through (what the orchestrator turns into the call's usage)."""
    charged = {"bytes_in": 0, "bytes_out": 0}

    def consume(kind: str, amount: int) -> None:
        charged[kind] = charged.get(kind, 0) + amount

    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 120, guard=guard,
                      consume=consume)
    res = ex.execute(ctx, ProcExecOp(tool="python3", args=("-c", script, *args)))
    assert res.out["exit_code"] == 0, res.out["stderr"]
    effects = [dict(e.meta) for e in ctx.side_effects
               if e.kind == SideEffect.NETWORK and e.meta.get("via") == "proxy"]
    assert MARKER.decode() not in json.dumps(effects)
    for kind in ("bytes_in", "bytes_out"):
        assert charged[kind] == sum(int(r.get(kind, 0)) for r in effects), (kind, effects)
    return json.loads(res.out["stdout"]), effects


def test_connect_under_a_get_only_rule_is_refused_before_any_byte_flows(
    bwrap_ex: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = restricted(tmp_path, server.port)
    target = f"127.0.0.1:{server.port}"
    out, effects = run(bwrap_ex, profile, guard, TUNNEL, target, "plain")
    assert out["connect"].startswith("HTTP/1.1 403"), out
    assert out["code"] == ErrorCode.CAPABILITY_BLOCKED.value
    assert "response" not in out
    assert server.seen.requests == []  # the POST never reached the server
    [rec] = effects
    assert rec["method"] == "CONNECT"
    assert rec["refused"] == ErrorCode.CAPABILITY_BLOCKED.value
    assert "bytes_out" not in rec


def test_plain_http_through_a_tunnel_is_cut_before_reaching_the_server(
    bwrap_ex: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    """Every method allowed, so the CONNECT is accepted; but a tunnel carries TLS only."""
    profile, guard = restricted(tmp_path, server.port, methods=ALL_METHODS,
                                limits="bytes_out 1MiB")
    target = f"127.0.0.1:{server.port}"
    out, effects = run(bwrap_ex, profile, guard, TUNNEL, target, "plain")
    assert out["connect"].startswith("HTTP/1.1 200"), out
    assert out.get("response", "") == "", out
    assert server.seen.requests == []
    [rec] = effects
    assert rec["refused"] == ErrorCode.CAPABILITY_BLOCKED.value
    # only the CONNECT head and the proxy's 200 were charged: not a byte of the plain request
    assert rec["bytes_out"] == len(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
    assert rec["bytes_in"] == len(b"HTTP/1.1 200 Connection Established\r\n\r\n")


def test_tls_tunnel_closes_when_bytes_out_run_out(
    bwrap_ex: ProcExecutor, tmp_path: Path,
) -> None:
    cert, key = self_signed(tmp_path, names=("localhost",), ips=("127.0.0.1",))
    with LoopbackServer(ROUTES, tls=server_tls(cert, key)) as tls_srv:
        profile, guard = restricted(tmp_path, tls_srv.port, methods=ALL_METHODS,
                                    schemes=("https",), limits="bytes_out 4KiB")
        out, effects = run(bwrap_ex, profile, guard, TUNNEL, f"127.0.0.1:{tls_srv.port}",
                           "tls", cert.read_text())
    assert out["connect"].startswith("HTTP/1.1 200"), out
    assert "error" in out or out.get("response", "") == "", out
    # the 50 KB body never arrived: no complete request (TLS records cut mid-way)
    assert [r for r in tls_srv.seen.requests if r[0] == "BODY"] == []
    [rec] = effects
    assert rec["cut_off"] is True
    assert 0 < rec["bytes_out"] <= 4096
    assert rec["bytes_in"] > 0  # the handshake came back: the tunnel did carry TLS


def test_forward_requests_share_the_calls_bytes_out_and_are_vetted_one_by_one(
    bwrap_ex: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = restricted(tmp_path, server.port, methods=("GET", "POST"))
    out, effects = run(bwrap_ex, profile, guard, FORWARD, f"http://127.0.0.1:{server.port}")
    # 600 + 600 bytes > 1 KiB: the second request is refused before its body is read
    assert out["first"] == 200
    assert out["second"] == [403, ErrorCode.CAPABILITY_BLOCKED.value]
    assert out["pipelined"] == 1  # one answer, then the connection closes: DELETE never ran
    # a header value a client cannot send as it is: a clean refusal, not a dropped connection
    assert out["non_ascii_header"] == [
        "HTTP/1.1 422 Unprocessable Content",
        f"X-Policy-Engine-Code: {ErrorCode.SCHEMA_VALIDATION_FAILED.value}"]
    methods = [m for m, _p, _h in server.seen.requests if m != "BODY"]
    assert methods == ["POST", "GET"]
    # one record per request, written as its connection ends: the first connection may end
    # after the second's refusal is recorded, so the records are matched by what they say
    assert sorted(str(r.get("refused")) for r in effects) == sorted(str(c) for c in (
        None, ErrorCode.CAPABILITY_BLOCKED.value, None,
        ErrorCode.SCHEMA_VALIDATION_FAILED.value))
    # request lines and headers count too: urllib's POST head, then the raw GET's alone (the
    # pipelined DELETE behind it was never read)
    get_head = f"GET http://127.0.0.1:{server.port}/ok HTTP/1.1\r\nHost: x\r\n" \
        "Connection: keep-alive\r\n\r\n"
    allowed = sorted(int(r["bytes_out"]) for r in effects if r.get("refused") is None)
    assert allowed[0] == len(get_head)
    assert 600 < allowed[1] <= 1024 - len(get_head)


@pytest.fixture
def docker_ex(tmp_path: Path) -> Iterator[DockerExecutor]:
    ex = DockerExecutor(DockerOptions(mode="run-once", workspace_root=str(tmp_path / "ws")))
    yield ex
    ex.close()


def test_docker_connect_under_a_get_only_rule_is_refused(
    docker_ex: DockerExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = restricted(tmp_path, server.port)
    out, effects = run(docker_ex, profile, guard, TUNNEL, f"127.0.0.1:{server.port}", "plain")
    assert out["connect"].startswith("HTTP/1.1 403"), out
    assert out["code"] == ErrorCode.CAPABILITY_BLOCKED.value
    assert server.seen.requests == []
    assert [r["refused"] for r in effects] == [ErrorCode.CAPABILITY_BLOCKED.value]


NAMED = r"""
import json, sys, urllib.request, urllib.error
out = {}
for name in sys.argv[2:]:
    try:
        out[name] = urllib.request.urlopen(f"http://{name}:{sys.argv[1]}/ok", timeout=10).status
    except urllib.error.HTTPError as e:
        out[name] = [e.code, e.headers.get("X-Policy-Engine-Code")]
print(json.dumps(out))
"""


def test_proxy_over_real_dns_refuses_metadata_and_mixed_answers_for_named_hosts(
    tmp_path: Path, server: LoopbackServer,
) -> None:
    """REPRO F10 in a real sandbox: the proxy resolves with a real DNS server on a loopback
    port; every name is named exactly by the rule."""
    zone = {"svc.test": ["127.0.0.1"], "meta.test": ["169.254.169.254"],
            "v6meta.test": ["fd00:ec2::254"], "mixed.test": ["127.0.0.1", "93.184.216.34"]}
    hosts = ", ".join(f'"{n}"' for n in zone)
    rules = (f'permit "named" net.http hosts [{hosts}] schemes ["http"] ports [{server.port}] '
             'methods ["GET"]')
    cap = NetHttpCapability(hosts=tuple(zone), schemes=("http",), ports=(server.port,),
                            methods=("GET",))
    profile, guard = compiled_profile(tmp_path, rules, (cap,), network="restricted")
    with LoopbackDns(zone) as dns, \
            RestrictedNetwork(profile, guard, resolver=dns.resolve).start() as net:
        run = sandboxed(net, ["python3", "-c", NAMED, str(server.port), *zone])
        out = json.loads(run.stdout)
        effects = [dict(e.meta) for e in net.side_effects()]
    blocked = [403, ErrorCode.CAPABILITY_BLOCKED.value]
    assert out == {"svc.test": 200, "meta.test": blocked, "v6meta.test": blocked,
                   "mixed.test": blocked}, run.stderr
    assert [p for m, p, _h in server.seen.requests] == ["/ok"]
    assert set(dns.queries) == set(zone)
    refused = [e for e in effects if "refused" in e]
    assert len(refused) == 3
    assert all("address" not in e for e in refused)  # nothing dialed
