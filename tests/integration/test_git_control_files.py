"""Writing git's control files is a built-in refusal the guard decides (outsider F9).

With `permit git status` and a workspace fs.write permit, writing ``.git/config`` with
``core.fsmonitor = <program>`` made the next `git status` run any program. Now a write to a
repository's configuration, hooks or the files that redirect them is refused unless the
permitting rule names the ``.git`` path itself; `explain` and `run` (CLI, real files) agree.
"""

from __future__ import annotations

import base64
import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.guard.gitfiles import git_control_file

POLICY = """policy "t/git" version "1.0.0"
defaults { timeout 20s  network off }
permit "git-status-only" proc.exec tool "git" args ["status"]
permit "ws-write" fs.write paths ["@ROOT@/**"]
@EXTRA@
require consent when `false`
"""
EXPLICIT = 'permit "git-config" fs.write paths ["@ROOT@/explicit/.git/config"]'

REFUSED = ["repo/.git/config", "repo/.git/hooks/post-index-change", "repo/.git/hooks",
           "repo/.git/commondir", "repo/.git/config.worktree", "repo/.git",
           "repo/.git/modules/sub/config", "repo/.git/worktrees/w/gitdir",
           "repo/sub/.git/hooks/pre-commit"]
ALLOWED = ["repo/.git/HEAD", "repo/.git/refs/heads/hooks", "repo/.git/description",
           "repo/a.txt", "repo/config", "repo/hooks/x", "explicit/.git/config"]


@pytest.fixture
def root() -> Iterator[Path]:
    r = Path("/workspace") / f"pe-gitfiles-{uuid.uuid4().hex[:12]}"  # the default root_fs
    r.mkdir(parents=True)
    yield r
    shutil.rmtree(r, ignore_errors=True)


def _cli(tmp_path: Path, root: Path, verb: str, rel: str) -> dict[str, object]:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)  # fs.write makes no directories
    perms = [{"kind": "fs.write", "paths": [f"{root}/**"]},
             {"kind": "proc.exec", "tool": "git"}]
    (tmp_path / "p.sbpolicy").write_text(POLICY.replace("@EXTRA@", EXPLICIT)
                                         .replace("@ROOT@", str(root)))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "w", "call_id": "c",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 100}}))
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "w", "version": "1", "permissions": perms, "side_effects": ["Write"],
        "safety_class": "Low"}))
    (tmp_path / "r.json").write_text(json.dumps({"op": {
        "kind": "fs.write", "path": f"{root}/{rel}",
        "bytes_b64": base64.b64encode(b"[core]\n\tfsmonitor = /bin/false\n").decode()}}))
    res = CliRunner().invoke(cli, [
        verb, "--policy", str(tmp_path / "p.sbpolicy"), "--manifest", str(tmp_path / "m.json"),
        "--grant", str(tmp_path / "g.json"), "--request", str(tmp_path / "r.json"),
        *(["--state-dir", str(tmp_path / "state")] if verb == "run" else []),
        "--format", "json"])
    assert "Traceback" not in res.output
    out: dict[str, object] = json.loads(res.output)
    return out


@pytest.mark.parametrize("rel", REFUSED)
def test_git_control_files_are_refused_by_explain_and_run(tmp_path: Path, root: Path,
                                                          rel: str) -> None:
    explained = _cli(tmp_path, root, "explain", rel)
    assert explained["decision"] == "deny"
    assert explained["code"] == "SANDBOX.CAPABILITY_BLOCKED"
    assert "git runs programs" in str(explained["reason"])
    ran = _cli(tmp_path, root, "run", rel)
    decision = ran["decision"]
    assert isinstance(decision, dict)
    assert decision["decision"] == "deny"
    assert decision["code"] == explained["code"]
    assert not (root / rel).exists()


@pytest.mark.parametrize("rel", ALLOWED)
def test_other_files_and_an_explicit_permit_are_written(tmp_path: Path, root: Path,
                                                        rel: str) -> None:
    assert _cli(tmp_path, root, "explain", rel)["decision"] == "allow"
    ran = _cli(tmp_path, root, "run", rel)
    result = ran["result"]
    assert isinstance(result, dict)
    assert result["ok"] is True, result
    assert (root / rel).is_file()


def test_the_classifier_names_the_part_it_refuses() -> None:
    assert git_control_file("/w/r/.git/config") == ".git/config"
    assert git_control_file("/w/r/.git/modules/s/hooks/x") == ".git/modules/s/hooks/x"
    assert git_control_file("/w/r/.git/objects/ab/config") is None
    assert git_control_file("/w/r/.github/config") is None
    assert git_control_file("/w/r/x.git/config") is None
