"""Refused before running costs nothing (issue 10 item 5), with the real executors: a call each
first-party executor refuses before it spawns, connects or creates anything leaves the grant's
`calls` budget untouched; the next allowed call still runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policy_engine.budget import grant_key
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.model import Grant, Manifest, NetHttpOp, OpKind, ProcExecOp, Settings
from policy_engine.orchestrator import Orchestrator

pytestmark = pytest.mark.integration
FAR = 4_102_444_800_000


def setup(tmp: Path, policy: str, caps: list[dict[str, Any]], network: str = "off",
          **cfg: Any) -> tuple[Orchestrator, Grant, Manifest]:
    path = tmp / "p.sbpolicy"
    path.write_text('policy "t/free-refusals" version "1.0.0"\n' + policy)
    grant = Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
        "capabilities": caps, "expires_at": FAR, "budget": {"calls": 1},
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": FAR}})
    manifest = Manifest.model_validate({
        "name": "tool", "version": "1", "permissions": caps, "side_effects": ["Process"],
        "safety_class": "Low", **({"network": network} if network != "off" else {})})
    config = EngineConfig(state_dir=tmp / "state", revocation="memory", **cfg)
    return Orchestrator(compile_files([path]), config=config), grant, manifest


def test_proc_cwd_refused_by_the_executor_is_free(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "other").mkdir()
    caps = [{"kind": "proc.exec", "tool": "true"}, {"kind": "fs.read", "paths": ["/**"]}]
    orch, grant, manifest = setup(
        tmp_path, f'defaults {{ timeout 20s }}\npermit "t" proc.exec tool "true"\n'
        f'permit "r" fs.read paths ["{root}/src/**"]\n', caps)
    settings = Settings(root_fs=str(root))
    with orch:
        for _ in range(3):  # beneath root_fs, but not a path the sandbox binds
            out = orch.run(grant, manifest, ProcExecOp(tool="true", cwd=str(root / "other")),
                           settings=settings)
            # the guard refuses it already, as the executor would (dry run equals run)
            assert out.decision.code == "SANDBOX.CAPABILITY_BLOCKED", out.decision
            assert "is not a readable path of the profile" in (out.decision.reason or "")
            assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED", out.result
            assert out.end.budget_used.calls == 0
        assert orch.meter.used(grant_key(grant)).get("calls", 0) == 0
        ok = orch.run(grant, manifest, ProcExecOp(tool="true", cwd=str(root / "src")),
                      settings=settings)
        assert ok.result.ok, ok.result
        over = orch.run(grant, manifest, ProcExecOp(tool="true"), settings=settings)
    assert over.result.code == "QUOTA.BUDGET_EXCEEDED"


def test_http_to_a_name_that_does_not_resolve_is_free(tmp_path: Path) -> None:
    caps = [{"kind": "net.http", "hosts": ["*.invalid"], "schemes": ["http"]}]
    orch, grant, manifest = setup(
        tmp_path, 'permit "w" net.http hosts ["*.invalid"] schemes ["http"]\n', caps,
        network="on")
    with orch:
        for _ in range(2):
            out = orch.run(grant, manifest, NetHttpOp(url="http://nothing-here.invalid/"))
            assert out.decision.allowed
            assert out.result.code == "PROVIDER.UNAVAILABLE", out.result
            assert out.end.budget_used.calls == 0
        assert orch.meter.used(grant_key(grant)).get("calls", 0) == 0


def test_docker_stdin_refusal_is_free(tmp_path: Path) -> None:
    """Run-once containers and the pool's launcher take stdin; a warm pool without its
    launcher (`docker exec` streams) refuses it before anything starts, at no cost."""
    (tmp_path / "ws").mkdir()
    caps = [{"kind": "proc.exec", "tool": "cat"},
            {"kind": "fs.write", "paths": ["/workspace/work/**"]}]
    orch, grant, manifest = setup(
        tmp_path, 'permit "c" proc.exec tool "cat"\n'
        'permit "w" fs.write paths ["/workspace/work/**"]\n', caps,
        backends={OpKind.PROC_EXEC: "docker"},
        options={"docker": {"mode": "pool", "pool_size": 1, "pool_launcher": False}})
    with orch:
        for _ in range(2):
            out = orch.run(grant, manifest, ProcExecOp(tool="cat", stdin_b64="aGk="),
                           settings=Settings(root_fs=str(tmp_path / "ws")))
            # the executor's refusal is the backend selection's: reported as the deny a dry
            # run answers (outsider round 5 F06)
            assert out.decision.decision == "deny"
            assert out.decision.code == "SANDBOX.CAPABILITY_BLOCKED"
            assert out.end.sandbox_backend == "docker"
            assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED", out.result
            assert out.end.budget_used.calls == 0
        assert orch.meter.used(grant_key(grant)).get("calls", 0) == 0
