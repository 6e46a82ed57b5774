"""Second-pass fuzz findings (issue 32.11) through the real CLI: each input ends in a located
diagnostic and exit 1/2, never `UNKNOWN.INTERNAL`. Inputs are the fuzzer's minimal reproducers,
rebuilt here so the test stands alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORG = ROOT / "examples" / "policies" / "org.sbpolicy"
REQUEST = ROOT / "examples" / "requests" / "read-workspace-file.json"
SKILL = ROOT / "skills" / "files.read" / "manifest.json"
LOCATED = re.compile(r":\d+:\d+: SBP\d{3} ")


def pe(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("POLICY_ENGINE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, env=env)


def no_crash(res: subprocess.CompletedProcess[str]) -> str:
    out = res.stdout + res.stderr
    assert "UNKNOWN.INTERNAL" not in out, out
    assert "Traceback" not in out, out
    return out


# ---- A: a lone surrogate escape in a policy string -----------------------------------------

SURROGATE_NAME = 'policy "\\uD800" version "1.0.0"\n'
SURROGATE_RULE = 'policy "s" version "1.0.0"\npermit "r" fs.read paths ["/workspace/\\uD800/**"]\n'
SURROGATE_HOST = 'policy "h" version "1.0.0"\npermit net.http hosts ["\\uDFFF/x"]\n'


@pytest.mark.parametrize(("text", "command", "where"), [
    (SURROGATE_NAME, ["check"], ":1:9:"),
    (SURROGATE_NAME, ["fmt", "--check"], ":1:9:"),
    (SURROGATE_RULE, ["lint"], ":2:39:"),
    (SURROGATE_HOST, ["check"], ":2:25:"),
    (SURROGATE_HOST, ["fmt", "--check"], ":2:25:"),
    (SURROGATE_HOST, ["lint"], ":2:25:"),
])
def test_lone_surrogate_is_a_located_sbp104(tmp_path: Path, text: str, command: list[str],
                                            where: str) -> None:
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(text, encoding="utf-8")
    res = pe(*command, str(policy))
    out = no_crash(res)
    assert res.returncode in (1, 2)
    assert f"{policy}{where} SBP104 " in out, out
    assert "lone UTF-16 surrogate" in out, out
    assert "help: write the character itself" in out


def test_lone_surrogate_in_fmt_stdin_and_explain(tmp_path: Path) -> None:
    res = pe("fmt", "-", stdin=SURROGATE_HOST)
    assert res.returncode == 2
    assert "<stdin>:2:25: SBP104 " in no_crash(res)
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(SURROGATE_NAME, encoding="utf-8")
    res = pe("explain", "--policy", str(policy), "--request", str(REQUEST))
    assert res.returncode == 2
    assert f"{policy}:1:9: SBP104 " in no_crash(res)


def test_a_surrogate_pair_is_one_character(tmp_path: Path) -> None:
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "p\\uD83D\\uDE00" version "1.0.0"\n'
                      'permit "r" fs.read paths ["/workspace/\\uD83D\\uDE00/**"]\n')
    res = pe("check", str(policy))
    assert res.returncode == 0, no_crash(res)
    res = pe("fmt", "-", stdin=policy.read_text())
    assert res.returncode == 0, res.stderr
    assert 'policy "p\U0001F600"' in res.stdout, res.stderr


def test_lone_surrogate_in_sandbox_json(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.json"
    config.write_text('{"filesystem": {"whitelist": ["/tmp/\\ud800"]}}\n')
    for command in (["sandbox", "check", str(config)], ["check", "--kind", "sandbox", str(config)]):
        res = pe(*command)
        out = no_crash(res)
        assert res.returncode == 1, out
        assert f"{config}:1:31: SBP105 " in out, out
        assert "lone UTF-16 surrogate" in out
    # `sandbox show` keeps the documented behaviour: the strict defaults, loudly
    res = pe("sandbox", "show", "--config", str(config))
    assert "strict defaults are in force" in no_crash(res)


def test_lone_surrogate_in_a_json_key(tmp_path: Path) -> None:
    """Found attacking the fix: the escape in a key reached the unknown-key diagnostic, whose
    printing failed; every JSON/YAML document is now checked where it is parsed."""
    config = tmp_path / "sandbox.json"
    config.write_text('{"filesystem": {"\\ud800": 1}}\n')
    res = pe("sandbox", "check", str(config))
    out = no_crash(res)
    assert res.returncode == 1, out
    assert f"{config}:1:17: SBP105 " in out, out
    request = tmp_path / "r.json"
    request.write_text('{"op": {"kind": "fs.read", "path": "/w"}, "\\udfffx": 1}')
    res = pe("explain", "--policy", str(ORG), "--request", str(request))
    out = no_crash(res)
    assert res.returncode == 2, out
    assert "is not valid Unicode (a lone UTF-16 surrogate" in out, out


# ---- B: an evidence line nested ~3,000 deep ------------------------------------------------

def _deep_log(tmp_path: Path) -> Path:
    log = tmp_path / "deep.jsonl"
    log.write_text("[" * 3000 + "]" * 3000 + "\n" + '{"type":' * 50_000 + "\n")
    return log


def test_deep_evidence_line_verify(tmp_path: Path) -> None:
    log = _deep_log(tmp_path)
    res = pe("evidence", "verify", str(log))
    out = no_crash(res)
    assert res.returncode == 1, out
    assert f"{log}:1: " in out, out
    assert "TAMPERED" in out, out


def test_deep_evidence_line_replay_and_diff(tmp_path: Path) -> None:
    log = _deep_log(tmp_path)
    res = pe("replay", "--policy", str(ORG), str(log))
    assert res.returncode == 0
    assert "0 call(s)" in no_crash(res)
    res = pe("diff", str(ORG), str(ORG), "--no-boundary", "--evidence", str(log))
    assert res.returncode == 0
    assert "0 call(s)" in no_crash(res)


# ---- C: skill manifests whose interface is no schema ---------------------------------------

def _skill(tmp_path: Path, inputs_patch: dict[str, object]) -> Path:
    manifest = json.loads(SKILL.read_text())
    manifest["interface"]["inputs"].update(inputs_patch)
    root = tmp_path / "skills"
    (root / "files.read").mkdir(parents=True)
    (root / "files.read" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root


@pytest.mark.parametrize(("patch", "pointer"), [
    ({"required": [["path"]]}, "/interface/inputs/required/0"),
    ({"properties": []}, "/interface/inputs/properties"),
])
def test_skill_interface_not_a_schema(tmp_path: Path, patch: dict[str, object],
                                      pointer: str) -> None:
    root = _skill(tmp_path, patch)
    res = pe("skills", "check", str(root))
    out = no_crash(res)
    assert res.returncode == 1, out
    assert LOCATED.search(out), out
    assert f"SBP435 {pointer}:" in out, out
    res = pe("skills", "list", str(root))
    assert res.returncode == 2
    assert f"SBP435 {pointer}:" in no_crash(res)
    # the servers refuse to start with the diagnostic, not an internal error
    state = tmp_path / "state"
    res = pe("mcp", "--policy", str(ORG), "--tenant", "t", "--subject", "s", "--state-dir",
             str(state), "--skills", str(root), stdin="")
    assert res.returncode == 2
    assert f"SBP435 {pointer}:" in no_crash(res)
    res = pe("serve", "--policy", str(ORG), "--state-dir", str(state), "--skills", str(root),
             "--port", "0", stdin="")
    assert res.returncode == 2
    assert f"SBP435 {pointer}:" in no_crash(res)
