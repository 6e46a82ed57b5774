"""Evidence names its decision, and `policy-engine replay` re-decides recorded calls offline.

Calls are run for real through `policy-engine run` (evidence written by the JSONL sink), then
replayed under a changed policy; nothing in replay executes (the changed policy would allow a
`git push`, and no process is started: the workspace stays untouched).
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.main import cli

OLD = '''policy "replay/test" version "1.0.0"

permit "git-read" proc.exec tool "git" args ["status" | "log" | "push", /.*/ ...]
forbid "no-push" proc.exec tool "git" args ["push", /.*/ ...]
permit "scratch" tmp.use max_bytes 1MiB
'''
NEW = OLD.replace('forbid "no-push" proc.exec tool "git" args ["push", /.*/ ...]\n', "")
GRANT = {"tenant": "acme", "subject_id": "agent:1", "tool_name": "shell", "call_id": "c1",
         "expires_at": 4_000_000_000_000,
         "capabilities": [{"kind": "proc.exec", "tool": "git"}, {"kind": "tmp.use"}]}
MANIFEST = {"name": "shell", "version": "1.0",
            "permissions": [{"kind": "proc.exec", "tool": "git"}, {"kind": "tmp.use"}]}
SECRET = "origin-secret-marker-7f3a"


def setup(tmp: Path, *, seal: bool) -> list[str]:
    (tmp / "old.sbpolicy").write_text(OLD)
    (tmp / "new.sbpolicy").write_text(NEW)
    (tmp / "g.json").write_text(json.dumps(GRANT))
    (tmp / "m.json").write_text(json.dumps(MANIFEST))
    (tmp / "cfg.json").write_text(json.dumps({"options": {"replay": {"seal": seal}}}))
    return ["--grant", str(tmp / "g.json"), "--manifest", str(tmp / "m.json"),
            "--state-dir", str(tmp / "state"), "--config", str(tmp / "cfg.json")]


def run(tmp: Path, common: list[str], *argv: str) -> None:
    result = CliRunner().invoke(cli, ["run", "--policy", str(tmp / "old.sbpolicy"), *common,
                                      "--", *argv])
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1), result.output


def replay(tmp: Path, *extra: str, policy: str = "new.sbpolicy") -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["replay", "--policy", str(tmp / policy), *extra,
                                      str(tmp / "state" / "evidence" / "evidence.jsonl")])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def records(tmp: Path) -> list[dict[str, object]]:
    log = tmp / "state" / "evidence" / "evidence.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in rows if r.get("type") != "checkpoint"]  # signed at close by default


def test_end_record_names_the_deciding_rule_version_reason_and_limits(tmp_path: Path) -> None:
    common = setup(tmp_path, seal=False)
    run(tmp_path, common, "git", "push", SECRET)
    end = records(tmp_path)[-1]
    assert end["type"] == "end"
    assert end["decision"] == "deny"
    assert end["rule"] == {"id": "no-push", "file": str(tmp_path / "old.sbpolicy"),
                           "line": 4, "column": 1}
    begin = records(tmp_path)[0]
    assert end["policy_version_hash"] == begin["policy_version_hash"]
    assert len(str(end["policy_version_hash"])) == 64
    assert end["reason"] == "forbid rule `no-push` blocks `git`"
    assert isinstance(end["limits"], dict)
    assert end["limits"]["timeout_ms"] == end["timeout_ms"]
    assert SECRET not in (tmp_path / "state" / "evidence" / "evidence.jsonl").read_text()


def test_replay_under_the_same_policy_changes_nothing(tmp_path: Path) -> None:
    common = setup(tmp_path, seal=True)
    run(tmp_path, common, "git", "status")
    run(tmp_path, common, "git", "push", SECRET)
    code, out = replay(tmp_path, "--state-dir", str(tmp_path / "state"), policy="old.sbpolicy")
    assert code == 0, out
    assert "2 call(s): 0 changed, 2 unchanged, 0 not replayable" in out


def test_sealed_replay_shows_the_changed_call_with_both_rules(tmp_path: Path) -> None:
    common = setup(tmp_path, seal=True)
    run(tmp_path, common, "git", "status")
    run(tmp_path, common, "git", "push", SECRET)
    log_text = (tmp_path / "state" / "evidence" / "evidence.jsonl").read_text()
    assert SECRET not in log_text  # sealed, not in clear
    code, out = replay(tmp_path, "--state-dir", str(tmp_path / "state"))
    assert code == 1, out
    assert "changed:" in out
    assert "before: deny SANDBOX.CAPABILITY_BLOCKED by no-push@old.sbpolicy:4:1" in out
    assert "after:  allow by git-read@new.sbpolicy:3:1" in out
    assert "1 changed, 1 unchanged" in out
    assert SECRET not in out
    code, js = replay(tmp_path, "--state-dir", str(tmp_path / "state"), "--format", "json")
    data = json.loads(js)
    assert data["summary"] == {"total": 2, "changed": 1, "same": 1, "unreplayable": 0}
    assert data["calls"][0]["new"]["rule"] == "git-read@new.sbpolicy:3:1"
    code, md = replay(tmp_path, "--state-dir", str(tmp_path / "state"), "--format",
                      "markdown")
    assert "| `proc.exec:git` (" in md
    assert "**1 changed**" in md


def test_without_the_seal_key_withheld_arguments_are_reported_not_guessed(
        tmp_path: Path) -> None:
    common = setup(tmp_path, seal=True)
    run(tmp_path, common, "git", "push", SECRET)
    run(tmp_path, common, "git", "status")  # every argument a policy literal: in clear
    code, out = replay(tmp_path)
    assert code == 0
    assert "withheld parts are sealed: give --seal-key" in out
    assert "0 changed, 1 unchanged, 1 not replayable" in out
    (tmp_path / "wrong.key").write_bytes(b"k" * 32)
    code, out = replay(tmp_path, "--seal-key", str(tmp_path / "wrong.key"))
    assert "does not open with this key" in out


def test_unsealed_evidence_names_the_missing_arguments(tmp_path: Path) -> None:
    common = setup(tmp_path, seal=False)
    run(tmp_path, common, "git", "push", SECRET)
    code, out = replay(tmp_path)
    assert code == 0
    assert "argument(s) 2 are recorded as keyed digests only" in out


def test_a_sealed_copy_moved_to_another_record_does_not_open(tmp_path: Path) -> None:
    common = setup(tmp_path, seal=True)
    run(tmp_path, common, "git", "push", SECRET)
    run(tmp_path, common, "git", "log", "other-secret")
    log = tmp_path / "state" / "evidence" / "evidence.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    begins = [r for r in rows if r["type"] == "begin"]
    begins[1]["replay"]["sealed"] = begins[0]["replay"]["sealed"]  # bound to its envelope
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out = replay(tmp_path, "--state-dir", str(tmp_path / "state"))
    assert "does not open with this key" in out
    assert "1 not replayable" in out


def test_bad_inputs_exit_2(tmp_path: Path) -> None:
    setup(tmp_path, seal=False)
    result = CliRunner().invoke(cli, ["replay", "--policy", str(tmp_path / "new.sbpolicy"),
                                      str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2
    assert "cannot read" in result.output
    (tmp_path / "short.key").write_bytes(b"x")
    result = CliRunner().invoke(cli, ["replay", "--policy", str(tmp_path / "new.sbpolicy"),
                                      "--seal-key", str(tmp_path / "short.key"),
                                      str(tmp_path / "g.json")])
    assert result.exit_code == 2
    assert "shorter than 32 bytes" in result.output


def test_sqlite_evidence_replays_and_diff_reads_evidence_too(tmp_path: Path) -> None:
    common = setup(tmp_path, seal=True)
    (tmp_path / "cfg.json").write_text(json.dumps(
        {"evidence_sinks": ["jsonl", "sqlite"], "options": {"replay": {"seal": True}}}))
    run(tmp_path, common, "git", "push", SECRET)
    run(tmp_path, common, "git", "status")
    db = tmp_path / "state" / "evidence" / "evidence.sqlite"
    result = CliRunner().invoke(cli, ["replay", "--policy", str(tmp_path / "new.sbpolicy"),
                                      "--state-dir", str(tmp_path / "state"), str(db)])
    assert result.exit_code == 1, result.output
    assert "2 call(s): 1 changed, 1 unchanged" in result.output
    diffed = CliRunner().invoke(cli, [
        "diff", str(tmp_path / "old.sbpolicy"), str(tmp_path / "new.sbpolicy"),
        "--no-boundary", "--evidence", str(db), "--state-dir", str(tmp_path / "state")])
    assert diffed.exit_code == 1, diffed.output
    assert "before: deny SANDBOX.CAPABILITY_BLOCKED by no-push@old.sbpolicy:4:1" in diffed.output
    assert "after:  allow by git-read@new.sbpolicy:3:1" in diffed.output
    assert SECRET not in diffed.output


def test_bad_replay_options_stop_the_engine_with_a_clear_message(tmp_path: Path) -> None:
    common = setup(tmp_path, seal=False)
    for options, message in (({"seal": "yes"}, "`seal` must be true or false"),
                             ({"encrypt": True}, "unknown option `encrypt`")):
        (tmp_path / "cfg.json").write_text(json.dumps({"options": {"replay": options}}))
        result = CliRunner().invoke(cli, ["run", "--policy", str(tmp_path / "old.sbpolicy"),
                                          *common, "--", "git", "status"])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "Traceback" not in result.output
