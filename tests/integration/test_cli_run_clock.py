"""`policy-engine run` decides a real call at the real time: a request file's `now_ms` cannot
backdate the clock past a grant's expiry (found by the outsider attack, F11).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def test_a_backdated_request_cannot_run_an_expired_grant(tmp_path: Path) -> None:
    request = json.loads((ROOT / "examples/requests/expired-grant.json").read_text())
    request.update(op={"kind": "proc.exec", "tool": "git", "args": ["--version"]},
                   now_ms=1_700_000_000_000,  # before the grant's expiry (1790000000000)
                   manifest=str(ROOT / "examples/manifests/shell.json"),
                   grant=str(ROOT / "examples/grants/shell-expired.json"))
    request.pop("expect")
    path = tmp_path / "backdated.json"
    path.write_text(json.dumps(request))
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--format", "json",
         "--policy", str(ROOT / "examples/policies/org.sbpolicy"), "--request", str(path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "POLICY_ENGINE_STATE": str(tmp_path / "state"),
             "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["result"]["ok"] is False
    assert out["result"]["code"] == "SANDBOX.PERMISSION_DENY"
    assert "grant expired" in out["result"]["message"]
    assert "`now_ms` in the request is ignored" in proc.stderr
    records = [json.loads(line) for line in
               (tmp_path / "state/evidence/evidence.jsonl").read_text().splitlines()]
    # and a checkpoint signed at shutdown by default (issue 32 item 10)
    assert [r["type"] for r in records] == ["begin", "end", "checkpoint"]
    assert records[1]["status"] == "denied"


def test_run_says_it_meters_the_budget_itself(tmp_path: Path) -> None:
    """A request's `budget_used` is explain's what-if; `run` meters the recorded usage and says
    it ignores the file's claim, as it does for `now_ms` (outsider attack round 9, L1)."""
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "explain", "--format", "json",
         "--policy", str(ROOT / "examples/policies/org.sbpolicy"),
         "--request", str(ROOT / "examples/requests/budget-exhausted.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert "QUOTA.BUDGET_EXCEEDED" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--format", "json",
         "--policy", str(ROOT / "examples/policies/org.sbpolicy"),
         "--request", str(ROOT / "examples/requests/budget-exhausted.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "POLICY_ENGINE_STATE": str(tmp_path / "state"),
             "PYTHONPATH": str(ROOT)})
    assert "`budget_used` in the request is ignored by `run`" in proc.stderr, proc.stderr
