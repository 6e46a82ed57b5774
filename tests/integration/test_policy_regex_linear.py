"""Policy regexes run on RE2: a catastrophic-backtracking argument regex decides in linear time
(outsider attack F5), and a pattern RE2 cannot run is refused by ``check`` (SBP208)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]

_MANIFEST = {"name": "atk", "version": "1.0", "description": "x",
             "permissions": [{"kind": "proc.exec", "tool": "python3"}],
             "side_effects": ["Process"], "safety_class": "Low", "limits": {}}
_GRANT = {"tenant": "acme", "subject_id": "agent:atk", "tool_name": "atk", "call_id": "c-1",
          "capabilities": [{"kind": "proc.exec", "tool": "python3"}],
          "expires_at": 4102444800000, "budget": {"calls": 100},
          "decision_key_fingerprint": "fp-1",
          "consent": {"granted_by": "user:x", "granted_at": 1790000000000,
                      "expires_at": 4102444800000}}


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", *args], capture_output=True, text=True,
        timeout=60, cwd=tmp,
        env={"PATH": "/usr/bin:/bin", "POLICY_ENGINE_STATE": str(tmp / "state"),
             "PYTHONPATH": str(ROOT)})


def _files(tmp: Path, rule: str, args: list[str]) -> tuple[Path, Path]:
    policy = tmp / "p.sbpolicy"
    policy.write_text('policy "r" version "1.0.0"\n' + rule + "\nrequire consent when `false`\n")
    (tmp / "man.json").write_text(json.dumps(_MANIFEST))
    (tmp / "grant.json").write_text(json.dumps(_GRANT))
    req = tmp / "req.json"
    req.write_text(json.dumps({"op": {"kind": "proc.exec", "tool": "python3", "args": args},
                               "manifest": "man.json", "grant": "grant.json"}))
    return policy, req


def test_a_backtracking_regex_decides_a_hostile_argument_at_once(tmp_path: Path) -> None:
    # Python's `re` needs ~10^4 s for this (each further `a` multiplies by ~1.6)
    policy, req = _files(tmp_path, 'permit "re" proc.exec tool "python3" args [/(a|aa)+/]',
                         ["a" * 60 + "b"])
    started = time.monotonic()
    proc = _cli(tmp_path, "run", "--format", "json", "--policy", str(policy),
                "--request", str(req))
    assert time.monotonic() - started < 30
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["result"]["code"] == "SANDBOX.PERMISSION_DENY"
    records = [json.loads(line) for line in
               (tmp_path / "state/evidence/evidence.jsonl").read_text().splitlines()]
    # and a checkpoint signed at shutdown by default (issue 32 item 10)
    assert [r["type"] for r in records] == ["begin", "end", "checkpoint"]
    assert records[1]["status"] == "denied"


def test_the_same_regex_still_admits_what_it_matches(tmp_path: Path) -> None:
    policy, req = _files(tmp_path, 'permit "re" proc.exec tool "python3" args [/(a|aa)+/]',
                         ["a" * 61])
    proc = _cli(tmp_path, "explain", "--format", "json", "--policy", str(policy),
                "--request", str(req))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["decision"] == "allow"


@pytest.mark.parametrize("template", [
    r"args [/(a)\1/]",               # backreference
    r'args ["x", /^(?!-)/]',         # lookahead
    r"args [/(?<=a)b/]",             # lookbehind
    r'args ["x"] env [/^(?=LC_)/]',  # an env-name regex
])
def test_check_refuses_what_re2_cannot_run(tmp_path: Path, template: str) -> None:
    rule = f'permit "re" proc.exec tool "python3" {template}'
    col = rule.index("/") + 1
    policy, _ = _files(tmp_path, rule, [])
    proc = _cli(tmp_path, "check", str(policy))
    assert proc.returncode != 0
    assert f"p.sbpolicy:2:{col}: SBP208 invalid regex" in proc.stdout + proc.stderr
    assert "RE2" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_json_grant_with_lookaround_is_refused_at_its_position(tmp_path: Path) -> None:
    policy, req = _files(tmp_path, 'permit "re" proc.exec tool "python3"', ["x"])
    grant = dict(_GRANT, capabilities=[{"kind": "proc.exec", "tool": "python3", "args": [
        {"alternatives": [{"regex": "(?!-).*"}]}]}])
    (tmp_path / "grant.json").write_text(json.dumps(grant, indent=1))
    proc = _cli(tmp_path, "explain", "--policy", str(policy), "--request", str(req))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SBP208" in proc.stderr
    assert "alternatives[0].regex" in proc.stderr
    assert "grant.json:" in proc.stderr
    assert "Traceback" not in proc.stderr
