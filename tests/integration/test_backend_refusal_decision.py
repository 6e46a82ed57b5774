"""Outsider round 4 F03: a call the backend selection refuses (a named profile requiring
`isolation gvisor` on proc-bwrap) is a deny in the run's own report, as `explain --config` says:
`policy-engine run` printed `decision: allow` (JSON `decision.decision == "allow"`, evidence end
`decision: allow`) beside the result `SANDBOX.CAPABILITY_BLOCKED`. Run through the CLI on the
real proc-bwrap backend (nothing starts: the refusal comes before the sandbox)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

POLICY = """policy "f03/gvisor" version "1.0.0"
profile "gvi" {{ network off  fs read-only  isolation gvisor  timeout 20s }}
permit "py" proc.exec tool "python3"
permit fs.read paths ["{ws}/**"]
require consent when `false`
"""


def _files(tmp_path: Path, backend: str) -> list[str]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (tmp_path / "p.sbpolicy").write_text(POLICY.format(ws=ws))
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "fs.read", "paths": [f"{ws}/**"]}]
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "pyrun", "version": "1.0.0", "profile": "gvi", "permissions": perms,
        "side_effects": ["Process"], "safety_class": "Low"}))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:x", "tool_name": "pyrun", "call_id": "c1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 100}}))
    (tmp_path / "req.json").write_text(json.dumps(
        {"op": {"kind": "proc.exec", "tool": "python3", "args": ["-c", "1"]}}))
    config = tmp_path / f"{backend}.yaml"
    config.write_text(f"state_dir: {tmp_path / ('state-' + backend)}\nmode: strict\n"
                      f"backends: {{proc.exec: {backend}}}\n")
    return ["--config", str(config), "--policy", str(tmp_path / "p.sbpolicy"),
            "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
            "--request", str(tmp_path / "req.json")]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def assert_run_denies_as_explain_said(ran: subprocess.CompletedProcess[str],
                                      said: dict[str, Any]) -> None:
    """`run --format json` refused the call with the deny `explain` answered: the same code,
    status and reason in the decision, and a deny in the evidence end record."""
    assert ran.returncode == 1, ran.stdout + ran.stderr
    out = json.loads(ran.stdout)
    assert out["result"]["ok"] is False
    assert out["result"]["code"] == "SANDBOX.CAPABILITY_BLOCKED"
    decision = out["decision"]
    assert decision["decision"] == "deny", decision
    assert decision["code"] == said["code"]
    assert decision["http_status"] == said["http_status"] == 403
    assert decision["reason"] == said["reason"]
    end = out["evidence"]
    assert end["status"] == "denied"
    assert end["error_code"] == "SANDBOX.CAPABILITY_BLOCKED"
    assert end["decision"] == "deny", end


@pytest.mark.parametrize("backend", ["proc-bwrap", "proc-unshare"])
def test_a_call_refused_by_backend_selection_is_a_deny_in_the_run(tmp_path: Path,
                                                                   backend: str) -> None:
    args = _files(tmp_path, backend)
    dry = _cli("explain", *args, "--format", "json")
    assert dry.returncode == 0, dry.stdout + dry.stderr  # a decision was made
    said = json.loads(dry.stdout)
    assert said["decision"] == "deny", said
    assert said["code"] == "SANDBOX.CAPABILITY_BLOCKED", said

    assert_run_denies_as_explain_said(_cli("run", *args, "--format", "json"), said)

    text = _cli("run", *args)
    assert text.returncode == 1
    first = text.stdout.splitlines()[0]
    assert first.startswith("decision: deny (SANDBOX.CAPABILITY_BLOCKED)"), text.stdout
    assert "decision: allow" not in text.stdout
