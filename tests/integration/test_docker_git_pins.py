"""Git in a docker sandbox never runs a program a workspace file names (outsider F9).

A `git status` permit must not become code execution through what the sandbox can write: the
repository's ``core.fsmonitor`` and hooks, ``~/.gitconfig`` (``HOME`` is ``work/``), or a bare
repository discovered in the working directory whose config names a work tree. Real git, real
containers; the repositories are owned by the container's uid, as ones it made itself would be.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from plugins.executor_docker.workspace import SANDBOX_UID, project_id_of
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_docker_executor import make_profile

pytestmark = pytest.mark.integration

EVIL = "#!/bin/sh\necho \"$0\" >> /workspace/work/RAN\n"


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[DockerExecutor, ExecContext, Path]]:
    root = tmp_path / "fs"
    root.mkdir()
    ex = DockerExecutor(DockerOptions(), state_dir=tmp_path / "state")
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 120)
    ex.execute(ctx, ProcExecOp(tool="true"))  # makes the project's directories
    work = tmp_path / "state" / "docker" / "projects" / project_id_of(ctx.profile) / "work"
    yield ex, ctx, work
    ex.close()


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _script(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(EVIL)
    path.chmod(0o755)
    return str(path).split("/work/", 1)[1]


def _own(work: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(work):
        for n in (dirpath, *(os.path.join(dirpath, x) for x in dirnames + filenames)):
            os.lchown(n, SANDBOX_UID, SANDBOX_UID)


def _status(ex: DockerExecutor, ctx: ExecContext, cwd: str) -> dict[str, object]:
    run = ExecContext(profile=ctx.profile, deadline=time.monotonic() + 120)
    return ex.execute(run, ProcExecOp(tool="git", args=("status",), cwd=cwd)).out


def test_repo_fsmonitor_and_hooks_do_not_run(setup: tuple[DockerExecutor, ExecContext, Path]
                                             ) -> None:
    ex, ctx, work = setup
    repo = work / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    (repo / "a.txt").write_text("a")
    monitor = _script(work / "bin" / "fsmonitor")
    _git("config", "core.fsmonitor", f"/workspace/work/{monitor}", cwd=repo)
    _script(repo / ".git" / "hooks" / "post-index-change")
    _own(work)
    out = _status(ex, ctx, "repo")
    assert out["exit_code"] == 0, out["stderr"]
    assert not (work / "RAN").exists(), (work / "RAN").read_text()


def test_home_gitconfig_is_not_read(setup: tuple[DockerExecutor, ExecContext, Path]) -> None:
    ex, ctx, work = setup
    repo = work / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    monitor = _script(work / "bin" / "fsmonitor")
    (work / ".gitconfig").write_text(f"[core]\n\tfsmonitor = /workspace/work/{monitor}\n")
    _own(work)
    out = _status(ex, ctx, "repo")
    assert out["exit_code"] == 0, out["stderr"]
    assert not (work / "RAN").exists(), (work / "RAN").read_text()


def test_a_bare_repository_in_the_cwd_is_not_discovered(
        setup: tuple[DockerExecutor, ExecContext, Path]) -> None:
    ex, ctx, work = setup
    bare = work / "data"
    for d in ("objects", "refs/heads"):
        (bare / d).mkdir(parents=True)
    (bare / "HEAD").write_text("ref: refs/heads/main\n")
    (work / "tree").mkdir()
    monitor = _script(work / "bin" / "fsmonitor")
    (bare / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        f"\tworktree = /workspace/work/tree\n\tfsmonitor = /workspace/work/{monitor}\n")
    _own(work)
    out = _status(ex, ctx, "data")
    assert not (work / "RAN").exists(), (work / "RAN").read_text()
    assert out["exit_code"] != 0  # not a repository: git looked no further
