"""A tree on a file system whose changes reach no inotify watch here (FUSE, NFS, CIFS, 9p,
virtiofs: another host or a daemon writes its backing store) is never vouched for by a watch:
every plan checks its stamps, and a proc-bwrap plan over it is never kept (attack 37, F1).

Before: a `.env` written into the backing store of a bound FUSE tree after the first plans
reached no watch, so the kept walk (and then the kept plan) masked nothing and the next
sandboxed `cat` printed it. Real FUSE (bindfs), real bwrap."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.sandbox import masks
from policy_engine.sandbox.masks import DirCache, blind_devices, plan_masks
from tests.integration.test_proc_sandbox import fs_cap, make_profile

pytestmark = pytest.mark.integration

ATTR_CACHE_S = 1.2  # FUSE keeps a file's attributes for 1 s by default (attr_timeout)


@pytest.fixture
def fuse_tree() -> Iterator[tuple[Path, Path]]:
    """(backing directory, its bindfs view), in a tree the sandbox uid may traverse (pytest's
    own is root's 0700: the engine would stage the bind, which changes the mount table)."""
    top = Path(tempfile.mkdtemp(prefix="pe-fuse-", dir="/tmp"))
    top.chmod(0o755)
    backing, view = top / "backing", top / "view"
    (backing / "src").mkdir(parents=True)
    view.mkdir()
    subprocess.run(["bindfs", "-o", "allow_other", str(backing), str(view)], check=True,
                   timeout=30)
    try:
        yield backing, view
    finally:
        subprocess.run(["fusermount", "-u", str(view)], check=False, timeout=30)
        shutil.rmtree(top, ignore_errors=True)


def test_a_fuse_mount_is_blind(fuse_tree: tuple[Path, Path]) -> None:
    _, view = fuse_tree
    assert view.stat().st_dev in blind_devices()
    assert Path("/usr").stat().st_dev not in blind_devices()


def test_a_plan_sees_a_secret_written_behind_the_fuse_view(
        fuse_tree: tuple[Path, Path]) -> None:
    backing, view = fuse_tree
    cache = DirCache()
    time.sleep(masks.RACY_NS / 1e9 + 0.05)
    for _ in range(3):
        plan = plan_masks([str(view)], [], ["/**/.env"], "/root", cache)
        assert not plan.files
    assert plan.vouched is False  # a kept plan needs the watches' word
    (backing / "src" / ".env").write_text("TOKEN=behind-the-view")
    time.sleep(ATTR_CACHE_S)
    plan = plan_masks([str(view)], [], ["/**/.env"], "/root", cache)
    assert str(view / "src" / ".env") in plan.files


def test_the_sandbox_does_not_read_a_secret_written_behind_the_fuse_view(
        fuse_tree: tuple[Path, Path]) -> None:
    backing, view = fuse_tree
    out = backing.parent / "out"
    out.mkdir(mode=0o777)
    profile = make_profile(view).model_copy(update={"capabilities": (
        fs_cap("fs.read", f"{view}/**"), fs_cap("fs.write", f"{out}/**"))})
    target = view / "src" / ".env"
    ex = ProcExecutor("bwrap")
    try:
        def run(tool: str) -> dict[str, object]:
            return ex.execute(ExecContext(profile=profile, deadline=time.monotonic() + 60),
                              ProcExecOp(tool=tool, args=(str(target),), cwd=str(view))).out
        time.sleep(masks.RACY_NS / 1e9 + 0.05)
        for _ in range(4):  # a plan would be kept after the second call
            assert run("true")["exit_code"] == 0
        (backing / "src" / ".env").write_text("TOKEN=behind-the-view")
        (backing / "src" / "notes.txt").write_text("control-readable")
        time.sleep(ATTR_CACHE_S)
        assert target.read_text() == "TOKEN=behind-the-view"  # the host sees it in the view
        got = ex.execute(ExecContext(profile=profile, deadline=time.monotonic() + 60),
                         ProcExecOp(tool="cat", args=(str(view / "src" / "notes.txt"),
                                                      str(target)), cwd=str(view))).out
        assert "control-readable" in str(got["stdout"]), got  # new files are seen
        assert "behind-the-view" not in str(got["stdout"]), got
    finally:
        ex.close()
