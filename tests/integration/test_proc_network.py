"""proc-bwrap with network ``restricted``: only the policy proxy is reachable, decided by the
call's compiled policy; real bwrap, real loopback servers, real curl.
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.model import (
    Consent,
    Grant,
    Manifest,
    NetHttpCapability,
    NetworkMode,
    ProcCapability,
    ProcExecOp,
    Profile,
    SideEffect,
)
from policy_engine.orchestrator import run_once
from tests.integration.servers import LoopbackServer, compiled_profile, send

pytestmark = pytest.mark.integration

ROUTES = {
    "/ok/page": lambda h: send(h, 200, "text/plain", b"allowed page"),
    "/nope": lambda h: send(h, 200, "text/plain", b"must never be served"),
}
CURL = ("-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}")


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


@pytest.fixture(scope="module", params=["native", "python"])
def executor(request: pytest.FixtureRequest) -> Iterator[ProcExecutor]:
    ex = ProcExecutor("bwrap", ProcOptions(launcher=request.param))
    assert ex.available() is True, ex.unavailable_reason
    yield ex
    ex.close()


def rules(port: int) -> str:
    return (f'permit "ok-paths" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{port}]\n'
            '  methods ["GET"] when `request.path.startsWith("/ok")`')


def policy(tmp: Path, port: int) -> tuple[Profile, Guard]:
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,),
                            methods=("GET",))
    profile, guard = compiled_profile(tmp, rules(port), (cap,), network="restricted")
    assert profile.network == NetworkMode.RESTRICTED
    return profile, guard


def call(ex: ProcExecutor, profile: Profile, guard: Guard | None, tool: str, *args: str,
         timeout: float = 60) -> tuple[dict[str, Any], ExecContext]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + timeout, guard=guard)
    res = ex.execute(ctx, ProcExecOp(tool=tool, args=args))
    return res.out, ctx


def proxied(ctx: ExecContext) -> list[dict[str, Any]]:
    return [dict(e.meta) for e in ctx.side_effects
            if e.kind == SideEffect.NETWORK and e.meta.get("via") == "proxy"]


def runtime_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("pe-net-")}


def test_curl_reaches_the_allowed_path_through_the_proxy(
    executor: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = policy(tmp_path, server.port)
    out, ctx = call(executor, profile, guard, "curl", *CURL, server.url("/ok/page?q=secret"))
    assert out["stdout"].splitlines() == ["allowed page", "200"], out["stderr"]
    assert out["network"] == out["network_requested"] == "restricted"
    iso = out["isolation"]
    assert iso["landlock"].startswith("enforced")
    assert iso["seccomp"].startswith("enforced")
    assert iso["tool_layer"]["landlock"].startswith("enforced")
    [rec] = proxied(ctx)
    assert rec["status"] == 200
    assert rec["url"] == f"http://127.0.0.1:{server.port}/ok/page"  # no query in evidence
    assert [p for _m, p, _h in server.seen.requests] == ["/ok/page?q=secret"]


def test_forbidden_path_and_host_are_refused_and_recorded(
    executor: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = policy(tmp_path, server.port)
    out, ctx = call(executor, profile, guard, "curl", *CURL, server.url("/nope"))
    assert out["stdout"].rstrip().endswith("403"), out
    [rec] = proxied(ctx)
    assert rec["refused"] == ErrorCode.PERMISSION_DENY.value
    assert rec["url"] == f"http://127.0.0.1:{server.port}/nope"
    out, ctx = call(executor, profile, guard, "curl", *CURL,
                    f"http://127.0.0.2:{server.port}/ok/page")
    assert out["stdout"].rstrip().endswith("403"), out
    assert [r["refused"] for r in proxied(ctx)] == [ErrorCode.PERMISSION_DENY.value]
    assert server.seen.requests == []


def test_without_a_context_guard_the_executor_guard_decides(
    tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = policy(tmp_path, server.port)
    ex = ProcExecutor("bwrap", guard=guard)
    try:
        out, _ = call(ex, profile, None, "curl", *CURL, server.url("/ok/page"))
    finally:
        ex.close()
    assert out["stdout"].splitlines() == ["allowed page", "200"], out["stderr"]


DIRECT = """
    import socket, sys
    results = []
    for port in (int(sys.argv[1]), 3128):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            results.append(f"connect {port} ok")
        except OSError as e:
            results.append(f"connect {port} {e.errno}")
        s.close()
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 8080))
        results.append("bind ok")
    except OSError as e:
        results.append(f"bind {e.errno}")
    print(";".join(results))
"""


def test_a_program_ignoring_the_proxy_variables_reaches_nothing(
    executor: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = policy(tmp_path, server.port)
    out, ctx = call(executor, profile, guard, "python3", "-c", textwrap.dedent(DIRECT),
                    str(server.port))
    # Landlock refuses the direct dial (EACCES) before the empty namespace would (ECONNREFUSED);
    # only the bridge's port is reachable; no TCP bind at all for the tool
    assert out["stdout"].strip() == f"connect {server.port} 13;connect 3128 ok;bind 13", out
    assert server.seen.requests == []
    # the empty connection to the bridge may reach the proxy (a refused malformed request)
    # or not (the bridge ended first); nothing is ever served
    assert all("status" not in r and "refused" in r for r in proxied(ctx))


def test_timeout_kills_the_tool_and_closes_the_proxy(
    executor: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    profile, guard = policy(tmp_path, server.port)
    before = runtime_dirs()
    script = ("import urllib.request, sys, time\n"
              "print(urllib.request.urlopen(sys.argv[1], timeout=20).status, flush=True)\n"
              "time.sleep(60)\n")
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60, guard=guard)
    op = ProcExecOp(tool="python3", args=("-c", script, server.url("/ok/page")),
                    timeout_ms=3000)
    with pytest.raises(PolicyEngineError) as info:
        executor.execute(ctx, op)
    assert info.value.code == ErrorCode.TIMEOUT
    assert [r["status"] for r in proxied(ctx)] == [200]  # recorded even though the call failed
    assert runtime_dirs() <= before


def test_proc_landlock_refuses_restricted(tmp_path: Path, server: LoopbackServer) -> None:
    profile, guard = policy(tmp_path, server.port)
    ex = ProcExecutor("landlock")
    try:
        assert NetworkMode.RESTRICTED not in ex.capabilities.network_modes
        with pytest.raises(PolicyEngineError) as info:
            call(ex, profile, guard, "true")
    finally:
        ex.close()
    assert info.value.code == ErrorCode.CAPABILITY_BLOCKED


def test_restricted_curl_through_the_orchestrator(tmp_path: Path, server: LoopbackServer) -> None:
    path = tmp_path / "p.sbpolicy"
    path.write_text('policy "t" version "1.0.0"\n' + rules(server.port)
                    + '\npermit "curl" proc.exec tool "curl"\n')
    net = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(server.port,),
                            methods=("GET",))
    caps = (net, ProcCapability(tool="curl"))
    manifest = Manifest(name="fetcher", version="1", permissions=caps, network="restricted",
                        side_effects=(SideEffect.PROCESS, SideEffect.NETWORK))
    now = int(time.time() * 1000)
    consent = Consent(granted_by="alice", granted_at=now - 1000, expires_at=now + 600_000)
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="fetcher", call_id="c-1",
                  capabilities=caps, expires_at=now + 3_600_000, consent=consent)
    config = EngineConfig(state_dir=tmp_path / "state", budget_meter="memory")
    ps = compile_files([path])
    ok = run_once(ps, grant, manifest, ProcExecOp(tool="curl", args=(
        *CURL, server.url("/ok/page"))), config=config)
    assert ok.result.ok, ok.result
    assert ok.end.sandbox_backend == "proc-bwrap"
    assert ok.result.out["stdout"].splitlines() == ["allowed page", "200"]
    refused = run_once(ps, grant, manifest, ProcExecOp(tool="curl", args=(
        *CURL, server.url("/nope"))), config=config)
    assert refused.result.ok  # curl itself ran; the proxy refused its request
    assert refused.result.out["stdout"].rstrip().endswith("403")
    records = [json.loads(line) for line in
               (config.state_dir / "evidence" / "evidence.jsonl").read_text().splitlines()]
    ends = [r for r in records if r["type"] == "end"]
    text = json.dumps(ends[-1])
    assert ErrorCode.PERMISSION_DENY.value in text, ends[-1]
    assert "/nope" in text
    assert [p for _m, p, _h in server.seen.requests] == ["/ok/page"]


def test_the_tools_launcher_tells_a_sigkill_from_an_exit_code_137(
    executor: ProcExecutor, tmp_path: Path, server: LoopbackServer,
) -> None:
    """Outsider round 5 F07: behind bwrap the engine sees 128 + N for both; the launcher at the
    end of the chain (bridge, then the tool's layer) reports which one ended the tool."""
    profile, guard = policy(tmp_path, server.port)
    out, _ = call(executor, profile, guard, "sh", "-c", "echo before; kill -9 $$")
    assert (out["exit_code"], out.get("signal"), out["stdout"]) == (137, 9, "before\n")
    assert out["isolation"]["tool_layer"]["landlock"].startswith("enforced")
    out, _ = call(executor, profile, guard, "sh", "-c", "exit 137")
    assert (out["exit_code"], out.get("signal")) == (137, None)
