"""Restricted proxy byte accounting: request lines, headers and bodies count toward ``bytes_out``,
response status lines, headers and bodies toward ``bytes_in`` (outsider attack F10), heads are
bounded, and a permitted POST carries its body to the server exactly (F14).

Real bubblewrap sandboxes (the proc executor), a real compiled policy, a real loopback server;
the sandboxed program talks to the proxy with raw sockets and reports exactly what it sent and
received, which the budget charge (what becomes the call's usage) and the evidence must match.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plugins.executor_proc.executor import ProcExecutor
from policy_engine.cli.main import cli
from policy_engine.errors import ErrorCode
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.model import (
    Grant,
    Manifest,
    NetHttpCapability,
    ProcCapability,
    ProcExecOp,
    Profile,
    SideEffect,
)
from policy_engine.netproxy import RestrictedNetwork
from tests.integration.servers import Handler, LoopbackServer, compiled_profile, send
from tests.integration.test_netproxy import sandboxed as sandboxed_net

pytestmark = pytest.mark.integration

BLOCKED = ErrorCode.CAPABILITY_BLOCKED.value
INVALID = ErrorCode.SCHEMA_VALIDATION_FAILED.value


def _echo(h: Handler) -> None:
    h.server.seen.requests.append(("BODY", h.body.hex(), {}))
    send(h, 200, "text/plain", b"got %d" % len(h.body))


ROUTES = {
    "/x": lambda h: send(h, 200, "text/plain", b"ok"),
    "/fat": lambda h: send(h, 200, "text/plain", b"ok", {"X-Fat": "f" * 3000}),
    "/echo": _echo,
}

# Runs inside the sandbox: each request of argv[1:] (a JSON list of [head, body] strings, latin-1)
# on its own connection to the proxy; prints what was sent and received, byte for byte.
RAW = r"""
import json, os, socket, sys
proxy = os.environ["http_proxy"][len("http://"):].rstrip("/")
phost, pport = proxy.rsplit(":", 1)
out = []
for head, body in json.loads(sys.argv[1]):
    req = head.encode("latin-1") + body.encode("latin-1")
    s = socket.create_connection((phost, int(pport)), timeout=10)
    s.sendall(req)
    got = b""
    try:
        while d := s.recv(65536):
            got += d
    except ConnectionResetError:
        got += b"<reset>"
    s.close()
    lines = got.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    code = next((l.split(":", 1)[1].strip() for l in lines
                 if l.lower().startswith("x-policy-engine-code:")), None)
    out.append({"sent": len(req), "received": len(got), "status_line": lines[0], "code": code,
                "body": got.split(b"\r\n\r\n", 1)[-1].decode("latin-1")})
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


def policy(tmp: Path, port: int, limits: str,
           methods: tuple[str, ...] = ("GET",)) -> tuple[Profile, Guard]:
    quoted = ", ".join(f'"{m}"' for m in methods)
    rules = (f"defaults {{\n  network restricted\n  limits {{ {limits} }}\n}}\n"
             f'permit "loop" net.http hosts ["127.0.0.1"] ports [{port}]\n'
             f'  schemes ["http"] methods [{quoted}]')
    cap = NetHttpCapability(hosts=("127.0.0.1",), ports=(port,), schemes=("http",),
                            methods=methods)
    return compiled_profile(tmp, rules, (cap,), tool="py", network="restricted")


def sandboxed(ex: ProcExecutor, profile: Profile, guard: Guard, argv: list[str],
              ) -> tuple[str, dict[str, int], list[dict[str, Any]]]:
    """Run ``argv`` in bwrap under ``profile``; (stdout, bytes charged, proxy evidence). The
    charge and the evidence must agree: the orchestrator turns the charge into the usage."""
    charged = {"bytes_in": 0, "bytes_out": 0}

    def consume(kind: str, amount: int) -> None:
        charged[kind] = charged.get(kind, 0) + amount

    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 120, guard=guard,
                      consume=consume)
    res = ex.execute(ctx, ProcExecOp(tool=argv[0], args=tuple(argv[1:])))
    assert res.out["exit_code"] == 0, res.out["stderr"]
    effects = [dict(e.meta) for e in ctx.side_effects
               if e.kind == SideEffect.NETWORK and e.meta.get("via") == "proxy"]
    for kind in ("bytes_in", "bytes_out"):
        assert charged[kind] == sum(int(r.get(kind, 0)) for r in effects), (kind, effects)
    return res.out["stdout"], charged, effects


def raw(ex: ProcExecutor, profile: Profile, guard: Guard, requests: list[tuple[str, str]],
        ) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]]]:
    stdout, charged, effects = sandboxed(ex, profile, guard,
                                         ["python3", "-c", RAW, json.dumps(requests)])
    return json.loads(stdout), charged, effects


def get(base: str, path: str, extra: str = "") -> tuple[str, str]:
    return f"GET {base}{path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n", ""


def test_url_and_header_bytes_count_against_bytes_out(
    bwrap_ex: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    """F10: 1 KB in the query and 1 KB in a header per request under ``bytes_out 10KiB``: four
    go through, charged exactly what the client sent; the rest are refused unsent."""
    profile, guard = policy(tmp_path, server.port, "bytes_out 10KiB  bytes_in 1MiB")
    base = f"http://127.0.0.1:{server.port}"
    reqs = [get(base, f"/x?i={i}&d={'q' * 1000}", f"X-Data: {'h' * 1000}\r\n")
            for i in range(8)]
    out, charged, effects = raw(bwrap_ex, profile, guard, reqs)
    statuses = [o["status_line"].split()[1] for o in out]
    assert statuses == ["200"] * 4 + ["403"] * 4, out
    assert [o["code"] for o in out[4:]] == [BLOCKED] * 4
    through = out[:4]
    assert charged["bytes_out"] == sum(o["sent"] for o in through) <= 10 * 1024
    # every byte of the answers, status line and headers included, is bytes_in
    assert charged["bytes_in"] == sum(o["received"] for o in through)
    assert len(server.seen.requests) == 4  # nothing of the refused requests left the proxy
    assert all(len(h["X-Data"]) == 1000 for _m, _p, h in server.seen.requests)
    assert [r.get("refused") for r in effects] == [None] * 4 + [BLOCKED] * 4
    assert "qqqq" not in json.dumps(effects)
    assert "hhhh" not in json.dumps(effects)


def test_response_headers_count_against_bytes_in(
    bwrap_ex: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    """A 2-byte body behind 3 KB of headers under ``bytes_in 2KiB``: the answer is refused
    (nothing of it reaches the client); a small answer after it still fits, charged exactly."""
    profile, guard = policy(tmp_path, server.port, "bytes_in 2KiB")
    base = f"http://127.0.0.1:{server.port}"
    out, charged, effects = raw(bwrap_ex, profile, guard, [get(base, "/fat"), get(base, "/x")])
    assert [o["status_line"].split()[1] for o in out] == ["403", "200"], out
    assert out[0]["code"] == BLOCKED
    assert "fff" not in out[0]["body"]
    assert charged["bytes_in"] == out[1]["received"]
    assert [r.get("refused") for r in effects] == [BLOCKED, None]


def test_oversized_request_heads_are_refused_with_431_and_414(
    bwrap_ex: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    """Heads are bounded whatever the byte limits: 5 headers of 7 KB (35 KB in all), one header
    line over 8 KiB, a request line over 8 KiB. Nothing reaches the server or is charged."""
    profile, guard = policy(tmp_path, server.port, "bytes_out 1MiB")
    base = f"http://127.0.0.1:{server.port}"
    many = "".join(f"X-D{i}: {'m' * 7000}\r\n" for i in range(5))
    reqs = [get(base, "/x", many), get(base, "/x", f"X-Long: {'l' * 9000}\r\n"),
            get(base, f"/x?d={'u' * 9000}"), get(base, "/x")]
    out, charged, effects = raw(bwrap_ex, profile, guard, reqs)
    assert [o["status_line"] for o in out] == [
        "HTTP/1.1 431 Request Header Fields Too Large",
        "HTTP/1.1 431 Request Header Fields Too Large",
        "HTTP/1.1 414 URI Too Long", "HTTP/1.1 200 OK"], out
    assert [o["code"] for o in out[:3]] == [INVALID] * 3
    assert [p for _m, p, _h in server.seen.requests] == ["/x"]
    assert charged["bytes_out"] == out[3]["sent"]
    assert [r.get("refused") for r in effects] == [INVALID] * 3 + [None]


def test_permitted_curl_post_delivers_its_body_exactly(
    bwrap_ex: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    """F14: curl POSTs a binary body (CR, LF, NUL, high bytes) under a rule allowing POST: the
    server receives it byte for byte; the charge is the body plus curl's request head."""
    profile, guard = policy(tmp_path, server.port, "bytes_out 10KiB", methods=("GET", "POST"))
    body = bytes(range(256)) * 4 + b"\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"
    script = ("import subprocess, sys\n"
              "r = subprocess.run(['curl', '-sS', '--max-time', '20', '-o', '-', '-w',"
              " '\\n%{http_code}', '--data-binary', '@-', sys.argv[1]],"
              " input=bytes.fromhex(sys.argv[2]), capture_output=True)\n"
              "sys.stdout.write(r.stdout.decode() + r.stderr.decode())\n")
    stdout, charged, effects = sandboxed(
        bwrap_ex, profile, guard,
        ["python3", "-c", script, f"http://127.0.0.1:{server.port}/echo", body.hex()])
    assert stdout.splitlines() == [f"got {len(body)}", "200"], stdout
    assert [r for r in server.seen.requests if r[0] == "BODY"] == [("BODY", body.hex(), {})]
    (post,) = [r for r in server.seen.requests if r[0] == "POST"]
    assert post[2]["Content-Length"] == str(len(body))
    (rec,) = effects
    assert rec["method"] == "POST"
    assert rec["status"] == 200
    # curl's request line and headers (~150 bytes) count too
    assert len(body) + 100 < charged["bytes_out"] == rec["bytes_out"] < len(body) + 400


CLI_POLICY = """policy "t/proxy-bytes" version "1.0.0"
defaults {{
  timeout 20s
  network restricted
  limits {{ bytes_in 50KiB  bytes_out 10KiB }}
}}
permit "py" proc.exec tool "python3"
permit "lo" net.http hosts ["127.0.0.1"] ports [{port}] schemes ["http"] methods ["GET"]
require consent when `false`
"""


def test_cli_usage_and_evidence_count_header_exfiltration(
    tmp_path: Path, server: LoopbackServer,
) -> None:
    """The attack through ``policy-engine run``: 20 requests of 3 KB in the URL and a header
    under ``bytes_out 10KiB``. Before: all 20 answered and ``used.bytes_out: 0``."""
    caps = (ProcCapability(tool="python3"),
            NetHttpCapability(hosts=("127.0.0.1",), ports=(server.port,), schemes=("http",),
                              methods=("GET",)))
    (tmp_path / "p.sbpolicy").write_text(CLI_POLICY.format(port=server.port))
    (tmp_path / "m.json").write_text(Manifest(
        name="atk", version="1", permissions=caps, side_effects=("Process", "Network"),
        network="restricted").model_dump_json())
    (tmp_path / "g.json").write_text(Grant(
        tenant="t", subject_id="agent:a", tool_name="atk", call_id="c", capabilities=caps,
        expires_at=4_102_444_800_000).model_dump_json())
    base = f"http://127.0.0.1:{server.port}"
    reqs = [get(base, f"/x?d={'q' * 1000}", f"X-Data: {'h' * 2000}\r\n") for _ in range(20)]
    result = CliRunner().invoke(cli, [
        "run", "--policy", str(tmp_path / "p.sbpolicy"), "--manifest", str(tmp_path / "m.json"),
        "--grant", str(tmp_path / "g.json"), "--state-dir", str(tmp_path / "state"),
        "--format", "json", "--", "python3", "-c", RAW, json.dumps(reqs)])
    doc = json.loads(result.output)
    assert doc["result"]["ok"] is True, result.output
    out = json.loads(doc["result"]["out"]["stdout"])
    assert [o["status_line"].split()[1] for o in out] == ["200"] * 3 + ["403"] * 17, out
    assert len(server.seen.requests) == 3
    used = doc["result"]["used"]
    assert used["bytes_out"] == sum(o["sent"] for o in out[:3]) <= 10 * 1024
    assert used["bytes_in"] == sum(o["received"] for o in out[:3])
    proxied = [e["meta"] for e in doc["evidence"]["side_effects"]
               if e["kind"] == "Network" and e["meta"].get("via") == "proxy"]
    assert [m.get("refused") for m in proxied] == [None] * 3 + [BLOCKED] * 17
    assert sum(m.get("bytes_out", 0) for m in proxied) == used["bytes_out"]
    assert "qqqq" not in result.output
    assert "hhhh" not in result.output


def test_a_rules_own_bytes_out_refuses_a_large_head_before_any_lookup(
    tmp_path: Path, server: LoopbackServer,
) -> None:
    """The call allows 1 MiB out, the matched rule 1 KiB: a 2 KB header is refused on the
    rule's limit before the name is resolved (no DNS query carries the request anywhere)."""
    lookups: list[str] = []

    def stub_dns(host: str, port: int) -> list[ipaddress.IPv4Address]:
        lookups.append(host)
        return [ipaddress.IPv4Address("127.0.0.1")]

    rules = ("defaults {\n  network restricted\n  limits { bytes_out 1MiB }\n}\n"
             f'permit "svc" net.http hosts ["svc.test"] ports [{server.port}] schemes ["http"]\n'
             '  methods ["GET"] limits { bytes_out 1KiB }')
    cap = NetHttpCapability(hosts=("svc.test",), ports=(server.port,), schemes=("http",),
                            methods=("GET",))
    profile, guard = compiled_profile(tmp_path, rules, (cap,), network="restricted")
    base = f"http://svc.test:{server.port}"
    reqs = [get(base, "/x", f"X-Data: {'h' * 2000}\r\n"), get(base, "/x")]
    with RestrictedNetwork(profile, guard, resolver=stub_dns).start() as net:
        run = sandboxed_net(net, ["python3", "-c", RAW, json.dumps(reqs)])
        effects = [dict(e.meta) for e in net.side_effects()]
        moved = net.traffic()
    out = json.loads(run.stdout)
    assert [o["status_line"].split()[1] for o in out] == ["403", "200"], run.stderr
    assert out[0]["code"] == BLOCKED
    assert lookups == ["svc.test"]  # only the small request was resolved
    assert [p for _m, p, _h in server.seen.requests] == ["/x"]
    assert moved == (out[1]["received"], out[1]["sent"])
    assert [e.get("refused") for e in effects] == [BLOCKED, None]
