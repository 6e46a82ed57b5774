"""`policy-engine diff OLD NEW`: request files, policy tests, evidence and the exact difference."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.analysis.difference import diff as exact_diff
from policy_engine.cli.main import cli
from policy_engine.compiler import compile_files

OLD = '''policy "diff/test" version "1.0.0"
defaults { network on }

permit "read-ws" fs.read paths ["/workspace/**"] limits { bytes_in 1MiB }
permit "api" net.http hosts ["api.example.com"] ports [443] methods ["GET"]
permit "git" proc.exec tool "git" args ["status" | "log"]
'''
# NEW widens the read rule to the whole of /srv as well and lets `git push` through
NEW = OLD.replace('paths ["/workspace/**"]', 'paths ["/workspace/**", "/srv/**"]').replace(
    '["status" | "log"]', '["status" | "log" | "push"]')
GRANT = {"tenant": "acme", "subject_id": "a", "tool_name": "t", "call_id": "c",
         "expires_at": 4_000_000_000_000,
         "capabilities": [{"kind": "fs.read", "paths": ["/**"]},
                          {"kind": "proc.exec", "tool": "git"}]}
MANIFEST = {"name": "t", "version": "1", "permissions": GRANT["capabilities"]}


def project(tmp: Path) -> None:
    (tmp / "old.sbpolicy").write_text(OLD)
    (tmp / "new.sbpolicy").write_text(NEW)
    (tmp / "g.json").write_text(json.dumps(GRANT))
    (tmp / "m.json").write_text(json.dumps(MANIFEST))
    for name, op in {"srv": {"kind": "fs.read", "path": "/srv/data.txt"},
                     "ws": {"kind": "fs.read", "path": "/workspace/a.txt"}}.items():
        (tmp / f"{name}.json").write_text(json.dumps(
            {"op": op, "now_ms": 1, "manifest": "m.json", "grant": "g.json"}))
    (tmp / "p.sbtest.yaml").write_text(
        "policy: old.sbpolicy\nmanifest: m.json\ngrant: g.json\nnow_ms: 1\ncases:\n"
        "  - name: push is refused\n    op: {kind: proc.exec, tool: git, args: [push]}\n"
        "    want_decision: deny\n"
        "  - name: status is fine\n    op: {kind: proc.exec, tool: git, args: [status]}\n"
        "    want_decision: allow\n")


def diff(tmp: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["diff", str(tmp / "old.sbpolicy"),
                                      str(tmp / "new.sbpolicy"), *extra])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_request_and_test_files_show_the_changed_decisions_with_both_rules(
        tmp_path: Path) -> None:
    project(tmp_path)
    code, out = diff(tmp_path, "--no-exact", "--request", str(tmp_path / "srv.json"),
                     "--request", str(tmp_path / "ws.json"),
                     "--tests", str(tmp_path / "p.sbtest.yaml"))
    assert code == 1
    assert f"changed: {tmp_path / 'srv.json'} fs.read:/srv/data.txt" in out
    assert "before: deny SANDBOX.PERMISSION_DENY (no rule)" in out
    assert "after:  allow by read-ws@new.sbpolicy:4:1" in out
    assert "p.sbtest.yaml: push is refused" in out
    assert "4 call(s): 2 changed, 2 unchanged, 0 not replayable" in out


def test_identical_versions_exit_0_and_markdown_is_a_pr_comment(tmp_path: Path) -> None:
    project(tmp_path)
    result = CliRunner().invoke(cli, ["diff", str(tmp_path / "old.sbpolicy"),
                                      str(tmp_path / "old.sbpolicy"), "--format", "markdown"])
    assert result.exit_code == 0
    assert "No decision changes." in result.output
    code, md = diff(tmp_path, "--format", "markdown", "--request", str(tmp_path / "srv.json"))
    assert code == 1
    assert md.startswith("### Policy diff: `old.sbpolicy` → `new.sbpolicy`")
    assert "| request | before | after |" in md
    assert "| `fs.read:/srv/data.txt`" in md


def test_the_exact_diff_finds_the_widening_without_any_request(tmp_path: Path) -> None:
    project(tmp_path)
    code, out = diff(tmp_path, "--format", "json")
    assert code == 1
    changes = json.loads(out)["exact"]["changes"]
    ops = {json.dumps(c["op"], sort_keys=True): c for c in changes}
    srv = next(c for c in changes if c["op"].get("path", "").startswith("/srv"))
    assert srv["old"]["decision"] == "deny"
    assert srv["new"]["decision"] == "allow"
    assert srv["new"]["rule"] == "read-ws@new.sbpolicy:4:1"
    assert srv["widening"]
    push = next(c for c in changes if c["op"].get("args") == ["push"])
    assert push["new"]["rule"] == "git@new.sbpolicy:6:1"
    # the untouched API rule did not move
    assert not any("api.example.com" in k for k in ops)


def test_identical_policies_are_decided_equal_everywhere(tmp_path: Path) -> None:
    """Same policy on both sides: no change, and the diff says it decided exactly."""
    project(tmp_path)
    ps = compile_files([tmp_path / "old.sbpolicy"])
    report = exact_diff(ps, ps)
    assert report.changes == []
    assert report.exact
    assert report.cells == 0  # the same rules: no region changed, nothing to walk
    other = compile_files([tmp_path / "new.sbpolicy"])
    assert exact_diff(ps, other).cells > 0


def test_a_tightened_timeout_shows_at_its_edge(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "new.sbpolicy").write_text(OLD.replace(
        'args ["status" | "log"]', 'args ["status" | "log"] limits { timeout 10s }'))
    (tmp_path / "old.sbpolicy").write_text(OLD.replace(
        'args ["status" | "log"]', 'args ["status" | "log"] limits { timeout 20s }'))
    code, out = diff(tmp_path, "--format", "json")
    assert code == 1, out
    changes = json.loads(out)["exact"]["changes"]
    timeouts = {c["op"].get("timeout_ms") for c in changes if c["old"]["decision"] == "allow"
                and c["new"]["decision"] == "deny"}
    assert timeouts
    assert all(10000 < t <= 20000 for t in timeouts)
    limits = [lc for c in changes for lc in c["limits"] if lc["field"] == "timeout_ms"]
    assert limits
    assert limits[0] == {"field": "timeout_ms", "old": 20000, "new": 10000,
                                    "stricter": "new"}


def test_bad_policy_exits_2_with_a_diagnostic(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "new.sbpolicy").write_text("policy oops\n")
    code, out = diff(tmp_path)
    assert code == 2
    assert "new.sbpolicy:1:" in out
