"""Shadow (audit) mode: a second policy's would-be denials are recorded, never enforced."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.config import EngineConfig
from policy_engine.model import TmpAllocOp
from policy_engine.orchestrator import Orchestrator

ENFORCED = 'policy "shadow/enforced" version "1.0.0"\n\npermit "scratch" tmp.use max_bytes 1MiB\n'
AUDIT = ('policy "shadow/audit" version "2.0.0"\n\n'
         'permit "small-scratch" tmp.use max_bytes 1KiB\n')
GRANT = {"tenant": "acme", "subject_id": "agent:1", "tool_name": "scratch", "call_id": "c1",
         "expires_at": 4_000_000_000_000, "capabilities": [{"kind": "tmp.use"}]}
MANIFEST = {"name": "scratch", "version": "1.0", "permissions": [{"kind": "tmp.use"}]}


def files(tmp: Path) -> None:
    (tmp / "enforced.sbpolicy").write_text(ENFORCED)
    (tmp / "audit.sbpolicy").write_text(AUDIT)
    (tmp / "g.json").write_text(json.dumps(GRANT))
    (tmp / "m.json").write_text(json.dumps(MANIFEST))
    (tmp / "r.json").write_text(json.dumps({"op": {"kind": "tmp.alloc", "size_bytes": 4096}}))


def test_a_call_the_audit_policy_would_deny_still_runs_and_the_denial_is_recorded(
        tmp_path: Path) -> None:
    files(tmp_path)
    result = CliRunner().invoke(cli, [
        "run", "--policy", str(tmp_path / "enforced.sbpolicy"), "--shadow-policy",
        str(tmp_path / "audit.sbpolicy"), "--grant", str(tmp_path / "g.json"), "--manifest",
        str(tmp_path / "m.json"), "--request", str(tmp_path / "r.json"), "--state-dir",
        str(tmp_path / "state")])
    assert result.exit_code == 0, result.output  # enforced: allowed, and it ran
    assert "result: ok" in result.output
    assert "shadow (not enforced): deny (SANDBOX.CAPABILITY_BLOCKED) by small-scratch" \
        in result.output
    log = tmp_path / "state" / "evidence" / "evidence.jsonl"
    begin, end = (json.loads(x) for x in log.read_text().splitlines()[:2])
    assert end["status"] == "ok"
    assert end["rule"]["id"] == "scratch"
    shadow = begin["shadow"]
    assert shadow["would_deny"] is True
    assert shadow["differs"] is True
    assert shadow["rule"]["id"] == "small-scratch"
    assert shadow["policy_version_hash"] != begin["policy_version_hash"]


def test_would_deny_is_counted_by_code_and_rule(tmp_path: Path) -> None:
    files(tmp_path)
    config = EngineConfig(state_dir=tmp_path / "state", budget_meter="memory",
                          revocation="memory")
    grant, manifest = load_grant(tmp_path / "g.json"), load_manifest(tmp_path / "m.json")
    with Orchestrator(compile_files([tmp_path / "enforced.sbpolicy"]), config=config,
                      shadow=compile_files([tmp_path / "audit.sbpolicy"])) as orch:
        big = orch.run(grant, manifest, TmpAllocOp(size_bytes=4096))
        small = orch.run(grant, manifest, TmpAllocOp(size_bytes=16))
        assert big.result.ok
        assert small.result.ok
        assert big.begin.shadow is not None
        assert big.begin.shadow["would_deny"] is True
        assert small.begin.shadow is not None
        assert small.begin.shadow["would_deny"] is False
        labels = {"code": "SANDBOX.CAPABILITY_BLOCKED", "rule": "small-scratch"}
        assert orch.metrics.sample("sandbox_shadow_would_deny_total", labels) == 1.0


def test_without_a_shadow_policy_nothing_is_recorded(tmp_path: Path) -> None:
    files(tmp_path)
    config = EngineConfig(state_dir=tmp_path / "state", budget_meter="memory",
                          revocation="memory")
    with Orchestrator(compile_files([tmp_path / "enforced.sbpolicy"]), config=config) as orch:
        out = orch.run(load_grant(tmp_path / "g.json"), load_manifest(tmp_path / "m.json"),
                       TmpAllocOp(size_bytes=16))
    assert out.begin.shadow is None
