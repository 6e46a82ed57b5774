"""A policy's env allow-list decides what reaches a real sandboxed process (CLI `run`, bwrap)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.model import Grant, Manifest, ProcCapability

FAR = 4_102_444_800_000
POLICY = '''policy "t" version "1"
permit "env-locale" proc.exec tool "env" args [] env ["LANG", /^LC_/]
'''


def run(tmp_path: Path, env: dict[str, str]) -> dict[str, object]:
    (tmp_path / "p.sbpolicy").write_text(POLICY)
    caps = (ProcCapability(tool="env"),)
    manifest = Manifest(name="shell", version="1", permissions=caps, side_effects=("Read",))
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="shell", call_id="c",
                  capabilities=caps, expires_at=FAR)
    (tmp_path / "m.json").write_text(manifest.model_dump_json())
    (tmp_path / "g.json").write_text(grant.model_dump_json())
    (tmp_path / "r.json").write_text(json.dumps(
        {"op": {"kind": "proc.exec", "tool": "env", "args": [], "env": env}}))
    result = CliRunner().invoke(cli, [
        "run", "--policy", str(tmp_path / "p.sbpolicy"), "--manifest", str(tmp_path / "m.json"),
        "--grant", str(tmp_path / "g.json"), "--request", str(tmp_path / "r.json"),
        "--state-dir", str(tmp_path / "state"), "--format", "json"])
    out: dict[str, object] = json.loads(result.output)
    out["exit_code"] = result.exit_code
    return out


def test_a_listed_variable_reaches_the_process(tmp_path: Path) -> None:
    out = run(tmp_path, {"LANG": "xx_TEST.UTF-8", "LC_TIME": "C"})
    assert out["exit_code"] == 0, out
    stdout = out["result"]["out"]["stdout"]  # type: ignore[index]
    assert "LANG=xx_TEST.UTF-8\n" in stdout
    assert "LC_TIME=C\n" in stdout


def test_a_hijack_variable_is_refused_before_anything_runs_or_is_charged(
        tmp_path: Path) -> None:
    for env in ({"LD_PRELOAD": "/tmp/x.so"}, {"GIT_CONFIG_PARAMETERS": "'a.b'='c'"},
                {"PATH": "/tmp"}):
        out = run(tmp_path, env)
        assert out["exit_code"] == 1
        assert out["decision"]["code"] == "SANDBOX.CAPABILITY_BLOCKED"  # type: ignore[index]
        assert out["result"]["used"]["calls"] == 0  # type: ignore[index]
        assert "out" not in out["result"] or not out["result"]["out"]  # type: ignore[index,operator]
