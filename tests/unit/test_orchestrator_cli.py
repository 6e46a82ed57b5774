"""`policy-engine run`: exit codes (0 ran, 1 denied/failed, 2 bad input) and evidence written."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.run import command

POLICY = 'policy "cli/test" version "1.0.0"\n\npermit tmp.use max_bytes 1MiB\n'
GRANT = {"tenant": "acme", "subject_id": "agent:1", "tool_name": "scratch", "call_id": "c1",
         "expires_at": 4_000_000_000_000, "capabilities": [{"kind": "tmp.use"}]}
MANIFEST = {"name": "scratch", "version": "1.0", "permissions": [{"kind": "tmp.use"}]}


def files(tmp: Path, *, grant: object = GRANT) -> list[str]:
    (tmp / "p.sbpolicy").write_text(POLICY)
    (tmp / "g.json").write_text(json.dumps(grant))
    (tmp / "m.json").write_text(json.dumps(MANIFEST))
    return ["--policy", str(tmp / "p.sbpolicy"), "--grant", str(tmp / "g.json"),
            "--manifest", str(tmp / "m.json"), "--state-dir", str(tmp / "state")]


def test_denied_op_exits_1_and_still_writes_evidence(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps({"op": {"kind": "fs.read", "path": "/etc/x"}}))
    result = CliRunner().invoke(command, [*files(tmp_path), "--request",
                                          str(tmp_path / "r.json"), "--format", "json"])
    assert result.exit_code == 1, result.output
    out = json.loads(result.output)
    assert out["decision"]["decision"] == "deny"
    assert out["result"]["ok"] is False
    log = (tmp_path / "state" / "evidence" / "evidence.jsonl").read_text().splitlines()
    # and a checkpoint signed at shutdown with the default key (issue 32 item 10)
    assert [json.loads(x)["type"] for x in log] == ["begin", "end", "checkpoint"]


def test_argv_form_runs_a_proc_exec_and_renders_text(tmp_path: Path) -> None:
    result = CliRunner().invoke(command, [*files(tmp_path), "--", "git", "status"])
    assert result.exit_code == 1  # the policy permits no proc.exec
    assert "decision: deny" in result.output
    assert "evidence: " in result.output


def test_bad_input_exits_2_with_a_diagnostic_and_no_traceback(tmp_path: Path) -> None:
    bad_grant = {k: v for k, v in GRANT.items() if k != "tenant"}
    result = CliRunner().invoke(command, [*files(tmp_path, grant=bad_grant), "--", "ls"])
    assert result.exit_code == 2
    assert "SBP105" in result.output
    assert "Traceback" not in result.output
    neither = CliRunner().invoke(command, files(tmp_path))
    assert neither.exit_code == 2
    assert "exactly one of" in neither.output
    (tmp_path / "bad.yaml").write_text("mode: lenient\n")
    bad_config = CliRunner().invoke(command, [*files(tmp_path), "--config",
                                              str(tmp_path / "bad.yaml"), "--", "ls"])
    assert bad_config.exit_code == 2
    assert "`mode` must be `strict` or `compat`" in bad_config.output
