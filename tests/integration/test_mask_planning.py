"""Mandatory-deny masking on a real-sized repository (issue 10 item 6): no refusal, no cap,
secrets deep in ``node_modules`` masked inside the sandbox, and a warm plan lists nothing."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.repo_tree import make_repo
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from plugins.executor_proc.spec import build_plan
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.sandbox import masks
from policy_engine.sandbox.masks import DirCache, MaskPlan, plan_masks
from tests.integration.test_proc_sandbox import make_profile

PATTERNS = ("/**/.env", "/**/.envrc", "/**/credentials.json", "/**/secrets.json",
            "/etc/ssh/ssh_host_*_key")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_repo(tmp_path_factory.mktemp("big") / "root")
    (root / "out").mkdir()
    (root / "home").mkdir()
    (root / "node_modules" / "pkg700" / "lib" / "util" / ".env").write_text("TOKEN=deep-secret")
    (root / ".git" / "credentials.json").write_text("{\"token\": \"git-secret\"}")
    time.sleep(masks.RACY_NS / 1e9 + 0.2)  # listings of just-changed directories are not trusted
    return root


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    made = {b: ProcExecutor(b, ProcOptions()) for b in ("bwrap", "landlock")}
    yield made
    for ex in made.values():
        ex.close()


def test_plan_on_a_170k_entry_repository_is_not_refused_and_finds_deep_secrets(
        repo: Path) -> None:
    plan = build_plan(make_profile(repo), ProcExecOp(tool="true"))
    assert str(repo / "node_modules" / "pkg700" / "lib" / "util" / ".env") in plan.mask_files
    assert str(repo) in plan.readable


@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "ctime-only"])
def test_a_warm_plan_lists_no_directory_and_sees_a_new_secret(repo: Path, watch: bool) -> None:
    cache = DirCache(watch=watch)
    cold = plan_masks([str(repo)], ["/etc"], PATTERNS, str(repo / "home"), cache)
    assert cold.dirs_listed == cold.dirs_visited
    assert cold.dirs_visited > 15_000
    warm = plan_masks([str(repo)], ["/etc"], PATTERNS, str(repo / "home"), cache)
    assert warm.dirs_listed == 0
    assert warm.files == cold.files
    # each variant its own directory: a change younger than RACY_NS is re-listed on purpose
    planted = repo / "node_modules" / f"pkg{3 if watch else 4}" / "dist" / "esm" / ".envrc"
    d = planted.parent
    before = os.stat(d)
    try:
        planted.write_text("export X=1")
        # a process may set mtime back; ctime follows the clock, which it cannot set
        os.utime(d, ns=(before.st_atime_ns, before.st_mtime_ns))
        again = plan_masks([str(repo)], ["/etc"], PATTERNS, str(repo / "home"), cache)
        assert str(planted) in again.files
        assert again.dirs_listed >= 1
        assert again.dirs_listed < 10
    finally:
        planted.unlink()
        time.sleep(masks.RACY_NS / 1e9 + 0.2)  # the shared tree is settled for the next test


def test_an_unchanged_tree_is_not_walked_again_and_a_change_right_after_is_seen(
        tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    cache = DirCache()
    first = plan_masks([str(tmp_path)], [], PATTERNS, "/root", cache)
    assert first.files == ()
    # no sleep: the listing of `b` is too recent for ctime alone, inotify sees the change
    (tmp_path / "a" / "b" / "secrets.json").write_text("{}")
    second = plan_masks([str(tmp_path)], [], PATTERNS, "/root", cache)
    assert second.files == (str(tmp_path / "a" / "b" / "secrets.json"),)
    third = plan_masks([str(tmp_path)], [], PATTERNS, "/root", cache)
    assert third.files == second.files
    assert third.dirs_listed == 0


def test_incremental_plans_follow_creates_deletes_renames_and_bursts(tmp_path: Path) -> None:
    """Each step is checked against a fresh cold plan of the same tree (the ground truth)."""
    for i in range(5):
        (tmp_path / f"p{i}" / "lib" / "deep").mkdir(parents=True)
    (tmp_path / "keys").mkdir()
    pats = (*PATTERNS, f"{tmp_path}/keys/*.pem")
    cache = DirCache()

    def check() -> MaskPlan:
        warm = plan_masks([str(tmp_path)], [], pats, "/root", cache)
        cold = plan_masks([str(tmp_path)], [], pats, "/root", DirCache(watch=False))
        assert (warm.files, warm.dirs) == (cold.files, cold.dirs)
        return warm

    assert check().files == ()
    new_dir = tmp_path / "p1" / "lib" / "deep" / "fresh"
    new_dir.mkdir()
    (new_dir / ".env").write_text("x")  # a new directory holding a secret
    (tmp_path / "keys" / "a.pem").write_text("k")  # a nested start's bounded glob
    assert check().files == (str(tmp_path / "keys" / "a.pem"), str(new_dir / ".env"))
    (tmp_path / "keys" / "a.pem").unlink()
    os.rename(tmp_path / "p1", tmp_path / "p1-moved")  # the watched directory moves
    assert check().files == (str(tmp_path / "p1-moved" / "lib" / "deep" / "fresh" / ".env"),)
    (tmp_path / "p2" / "secrets.json").mkdir()  # a directory masked whole
    (tmp_path / "p2" / "secrets.json" / "inner.txt").write_text("y")
    assert check().dirs == (str(tmp_path / "p2" / "secrets.json"),)
    for i in range(80):  # more changed directories than an incremental plan takes
        (tmp_path / "p3" / f"d{i}").mkdir()
        (tmp_path / "p3" / f"d{i}" / ".envrc").write_text("z")
    assert len(check().files) == 81
    shutil.rmtree(tmp_path / "p3")  # watched directories deleted: each re-walked
    assert len(check().files) == 1


def test_globs_without_doublestar_are_pruned_by_depth(tmp_path: Path) -> None:
    (tmp_path / "keys" / "a" / "b").mkdir(parents=True)
    (tmp_path / "keys" / "x.pem").write_text("k")
    (tmp_path / "keys" / "a" / "b" / "y.pem").write_text("k")
    plan = plan_masks([str(tmp_path)], [], [f"{tmp_path}/keys/*.pem"], "/root", DirCache())
    assert plan.files == (str(tmp_path / "keys" / "x.pem"),)
    assert plan.dirs_visited == 1  # only keys/: the glob cannot match deeper, nor above it


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
def test_sandbox_on_the_big_repository_runs_and_cannot_read_the_deep_secret(
        executors: dict[str, ProcExecutor], repo: Path, backend: str) -> None:
    code = ("import sys\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        print(p.rsplit('/', 1)[1], repr(open(p).read()))\n"
            "    except OSError as e:\n"
            "        print(p.rsplit('/', 1)[1], 'blocked', e.errno)\n")
    secret = repo / "node_modules" / "pkg700" / "lib" / "util" / ".env"
    ctx = ExecContext(profile=make_profile(repo), deadline=time.monotonic() + 60)
    res = executors[backend].execute(ctx, ProcExecOp(
        tool=sys.executable, args=("-c", code, str(secret), str(repo / "src" / "main.py"))))
    out = res.out["stdout"]
    assert res.out["exit_code"] == 0, res.out["stderr"]
    assert "deep-secret" not in out
    assert "hello" in out
    assert str(secret) in res.out["masked"]
