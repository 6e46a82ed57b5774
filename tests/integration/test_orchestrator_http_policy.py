"""Through the real orchestrator, plugins and policy: a redirect hop is re-decided by the call's
policy-aware guard (passed to the executor as ``ExecContext.guard``), condition included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.graph import PolicySet
from policy_engine.model import Grant, Manifest, NetHttpCapability, NetHttpOp
from policy_engine.orchestrator import run_once
from tests.integration.servers import LoopbackServer, redirect, send

pytestmark = pytest.mark.integration

ROUTES = {
    "/ok/page": lambda h: send(h, 200, "text/plain", b"allowed page"),
    "/ok/jump": redirect("/nope"),
    "/nope": lambda h: send(h, 200, "text/plain", b"must never be served"),
}


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


def setup(tmp: Path, port: int) -> tuple[EngineConfig, Grant, Manifest, PolicySet]:
    policy = tmp / "p.sbpolicy"
    policy.write_text(
        'policy "t" version "1.0.0"\n'
        f'permit "ok-paths" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{port}]\n'
        '  methods ["GET"] mime ["text/plain"]\n'
        '  when `request.path.startsWith("/ok") && grant.subject_id.startsWith("agent:")`\n')
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,),
                            methods=("GET",))
    manifest = Manifest(name="fetch", version="1", permissions=(cap,), network="on")
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="fetch", call_id="c-1",
                  capabilities=(cap,), expires_at=4_102_444_800_000)
    config = EngineConfig(state_dir=tmp / "state", budget_meter="memory")
    return config, grant, manifest, compile_files([policy])


def test_allowed_get_and_a_refused_redirect_hop_through_the_orchestrator(
    tmp_path: Path, server: LoopbackServer,
) -> None:
    config, grant, manifest, ps = setup(tmp_path, server.port)
    ok = run_once(ps, grant, manifest, NetHttpOp(url=server.url("/ok/page")), config=config)
    assert ok.result.ok, ok.result
    assert ok.end.sandbox_backend == "http"
    jumped = run_once(ps, grant, manifest, NetHttpOp(url=server.url("/ok/jump")), config=config)
    # the first request was allowed (the condition holds for /ok/jump and the agent subject,
    # seen through the grant view the guard builds itself); the hop to /nope is refused
    assert jumped.decision.allowed
    assert not jumped.result.ok
    assert jumped.result.code == "SANDBOX.PERMISSION_DENY"
    assert [p for _m, p, _h in server.seen.requests] == ["/ok/page", "/ok/jump"]
    records = [json.loads(line) for line in
               (config.state_dir / "evidence" / "evidence.jsonl").read_text().splitlines()]
    records = [r for r in records if r["type"] != "checkpoint"]  # signed at close by default
    assert [r["type"] for r in records] == ["begin", "end", "begin", "end"]
    assert records[-1]["error_code"] == "SANDBOX.PERMISSION_DENY"
