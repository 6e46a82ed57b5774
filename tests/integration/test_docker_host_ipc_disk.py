"""Second-pass findings N2 and N1 on the docker executor, run for real: a root-owned host Unix
listener in a bound tree (a ``system_binds`` directory) is unreachable from a container with
network off, run-once and warm pool alike, and ``fallocate`` cannot preallocate past the file
cap (issue 32, items 1 and 2)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_disk_write_quota import QUOTA, WRITER
from tests.integration.test_docker_executor import make_profile
from tests.integration.test_host_ipc_disk import FALLOC, PROBE, host_listener

pytestmark = pytest.mark.integration

CAP = 1 << 20


@pytest.fixture
def shared() -> Iterator[Path]:
    """A host tree bound read-only into the containers (as ``/usr`` is), holding a listener."""
    d = Path(tempfile.mkdtemp(prefix="pe-dockeripc-", dir="/var/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(ex: DockerExecutor, root: Path, code: str, *args: str) -> dict[str, object]:
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 90)
    return ex.execute(ctx, ProcExecOp(tool="/usr/bin/python3", args=("-c", code, *args))).out


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_a_host_unix_listener_in_a_bound_tree_is_unreachable(
        tmp_path: Path, shared: Path, mode: str) -> None:
    ex = DockerExecutor(DockerOptions(mode=mode, pool_size=1, workspace_root=str(tmp_path / "ws"),
                                      system_binds=("/usr", str(shared))))
    sock = shared / "host.sock"
    try:
        with host_listener(sock) as got:
            out = _run(ex, tmp_path, PROBE, str(sock))
    finally:
        ex.close()
    assert out["exit_code"] == 0, out
    stdout = str(out["stdout"])
    assert "CONNECTED" not in stdout, stdout
    assert stdout.count("blocked") == 2, stdout
    assert "pair pair" in stdout, stdout
    assert got == []


def test_fallocate_cannot_preallocate_past_the_file_cap(tmp_path: Path) -> None:
    ex = DockerExecutor(DockerOptions(workspace_root=str(tmp_path / "ws"), max_file_bytes=CAP))
    try:
        out = _run(ex, tmp_path, FALLOC, "/workspace/work/fa.bin", str(64 << 20))
    finally:
        ex.close()
    stdout = str(out["stdout"])
    assert out["exit_code"] == 0, out
    for m in (1, 0x10, 0x11, 0x20, 0x4):
        assert f"mode {m} -1 95" in stdout, stdout  # EOPNOTSUPP
    assert "plain 0" in stdout, stdout
    allocated = int(stdout.split("allocated ")[1].split()[0])
    assert allocated <= CAP, stdout
    for name in ("setxattr", "fsetxattr", "lsetxattr"):  # attack 36: unmetered disk blocks
        assert f"{name} errno 95" in stdout, stdout  # EOPNOTSUPP


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_many_files_past_the_write_quota_are_killed_and_refused(
        tmp_path: Path, mode: str) -> None:
    """The per-file cap bounds one file; 160 files of 1 MiB - 1 each went through it. With a
    `disk_write_bytes` of 8 MiB the container is killed near it: QUOTA.BUDGET_EXCEEDED."""
    ex = DockerExecutor(DockerOptions(mode=mode, pool_size=1, max_file_bytes=CAP,
                                      workspace_root=str(tmp_path / "ws")))
    profile = make_profile(tmp_path, disk_write_bytes=QUOTA)
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 90, limits=profile.limits)
    op = ProcExecOp(tool="/usr/bin/python3", args=("-c", WRITER, "/workspace/work", "160",
                                                  "self"))
    started = time.monotonic()
    try:
        with pytest.raises(PolicyEngineError) as err:
            ex.execute(ctx, op)
        under = ExecContext(profile=profile, deadline=time.monotonic() + 90,
                            limits=profile.limits)
        ok = ex.execute(under, ProcExecOp(tool="/usr/bin/python3", args=(
            "-c", WRITER, "/workspace/work", "4", "self"))).out  # 4 MiB of 8: runs
    finally:
        ex.close()
    assert err.value.code is ErrorCode.BUDGET_EXCEEDED, err.value
    assert "disk write quota exceeded" in str(err.value)
    assert time.monotonic() - started < 60
    written = sum(p.stat().st_blocks * 512 for p in (tmp_path / "ws").rglob("f*")
                  if p.is_file())
    # killed before its end (160 files of 1 MiB): how far past the quota depends on when the
    # watchdog thread samples and dockerd kills, which load delays (docs/operations.md
    # measures 45-100 MB at load 7); the proc backends hold a tight bound (test_disk_write_quota)
    assert written < 150 * CAP, written
    assert ok["exit_code"] == 0, ok
    assert "wrote 4" in str(ok["stdout"])
