"""An fs read or listing runs in the calling thread only while every file system beneath the
root is local; a mount of anything else there sends it back to a watched thread at once.

Real mounts (root): a ``proc`` mounted beneath the root stands for a file system whose reads a
process or server answers (NFS, FUSE), as ``mounts.LOCAL_TYPES`` sorts them.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_fs.executor import FsExecutor
from plugins.executor_fs.mounts import LocalMounts, all_local, parse_mountinfo
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.confirm.broker import ConsentBroker
from policy_engine.confirm.services import WebhookConfirmation
from policy_engine.executor import ExecContext
from policy_engine.gateway.call import Gateway
from policy_engine.gateway.loop_sized import LOOP_READ_BYTES, loop_sized
from policy_engine.model import ExecResult, FsListOp, FsReadOp, FsWriteOp, OpKind
from policy_engine.orchestration.running import run_with_deadline
from policy_engine.orchestrator import Orchestrator
from tests.integration.service_server import POLICY
from tests.unit.test_executor_fs import make_profile

pytestmark = pytest.mark.integration

TABLE = """\
22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l
23 22 0:22 / /proc rw,nosuid - proc proc rw
24 22 8:1 /work /work rw,relatime - ext4 /dev/sda1 rw
25 24 0:40 / /work/remote rw - nfs4 server:/export rw
26 24 0:41 / /work/with\\040space rw - fuse.sshfs host: rw
27 22 0:42 / /srv rw - tmpfs tmpfs rw
28 27 0:43 / /srv rw - fuse.x x rw
"""


def test_the_mount_table_is_read_with_escapes_and_stacked_mounts() -> None:
    mounts = parse_mountinfo(TABLE)
    assert ("/work/with space", "fuse.sshfs") in mounts
    assert all_local(mounts, "/work/data")  # ext4, nothing non-local beneath
    assert not all_local(mounts, "/work")  # nfs4 and fuse beneath it
    assert not all_local(mounts, "/work/remote/x")  # held by the nfs4 mount
    assert not all_local(mounts, "/work/with space")
    assert not all_local(mounts, "/srv/a")  # the fuse mount on top of the tmpfs holds it
    assert not all_local(mounts, "/")  # proc beneath it
    assert all_local(mounts, "/workspace")  # held by the overlay root, not by /work
    assert not all_local([], "/work")  # nothing known: not local


@contextmanager
def mounted_proc(at: Path) -> Iterator[Path]:
    at.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(at)], check=True)
    try:
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=True)


class Watched(FsExecutor):
    """The fs executor, noting the thread each call ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        self.threads.append(threading.current_thread().name)
        return super().execute(ctx, op)


def test_a_mount_beneath_the_root_moves_reads_to_a_watched_thread_at_once(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "f.txt").write_text("hello\n")
    mounts = LocalMounts()
    assert mounts.local(str(root))
    ex = Watched()
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 30)
    here = threading.current_thread().name

    def read() -> str:
        attempt = run_with_deadline(ex, ctx, FsReadOp(path=f"{root}/data/f.txt"), None)
        assert attempt.result is not None, attempt.error
        assert attempt.result.out["size"] == 6
        return ex.threads[-1]

    assert read() == here
    attempt = run_with_deadline(ex, ctx, FsListOp(path=f"{root}/data"), None)
    assert attempt.result is not None, attempt.error
    assert ex.threads[-1] == here
    with mounted_proc(root / "proc"):
        assert not mounts.local(str(root))  # the next look sees the mount
        assert read().startswith("policy-engine-exec-")
        assert ex.stops_by_itself(OpKind.FS_READ, str(root / "data")) is True
    assert mounts.local(str(root))
    assert read() == here
    # a write fsyncs: always watched
    assert not ex.stops_by_itself(OpKind.FS_WRITE, str(root))
    attempt = run_with_deadline(ex, ctx, FsWriteOp(path=f"{root}/data/g.txt",
                                                   bytes_b64="aGk="), None)
    assert attempt.result is not None, attempt.error
    assert ex.threads[-1].startswith("policy-engine-exec-")


@pytest.mark.parametrize(("config", "on_caller"), [
    ({}, True),
    ({"options": {"evidence_jsonl": {"fsync": "never"}}}, True),
    ({"options": {"evidence_jsonl": {"fsync": "always"}}}, False),  # waits for the disk
    ({"evidence_sinks": ("jsonl", "sqlite")}, False),  # SQLite commits fsync
    ({"backends": {OpKind.FS_READ: "proc-bwrap"}}, False),  # not a contained backend
], ids=["default", "fsync-never", "fsync-always", "sqlite-sink", "other-backend"])
def test_only_a_call_that_waits_on_nothing_runs_on_the_caller(
        tmp_path: Path, config: dict[str, Any], on_caller: bool) -> None:
    root = tmp_path / "root"
    root.mkdir()
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(POLICY.format(root=root, ws=root / "ws"))
    with Orchestrator(compile_files([policy]), config=EngineConfig(
            state_dir=tmp_path / "state", **config)) as orch:
        assert orch.runs_on_caller(OpKind.FS_READ, str(root)) is on_caller
        assert not orch.runs_on_caller(OpKind.FS_WRITE, str(root))
        if on_caller:
            with mounted_proc(root / "proc"):
                assert not orch.runs_on_caller(OpKind.FS_READ, str(root))
            gateway = Gateway(orch)  # the default confirmation service denies at once
            assert gateway.runs_on_caller(OpKind.FS_READ, str(root))
            webhook = WebhookConfirmation("http://127.0.0.1:9/", b"s" * 16)
            asking = Gateway(orch, ConsentBroker(webhook, tmp_path / "consent.jsonl"))
            assert not asking.runs_on_caller(OpKind.FS_READ, str(root))


def test_a_forked_worker_sees_a_mount_its_parent_also_looked_at(tmp_path: Path) -> None:
    """`serve --workers N` forks: parent and child must not share the table's change flag."""
    root = tmp_path / "root"
    root.mkdir()
    mounts = LocalMounts()
    assert mounts.local(str(root))
    go_r, go_w = os.pipe()
    answer_r, answer_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: one look before the mount, one after
        try:
            os.write(answer_w, b"%d" % mounts.local(str(root)))
            os.read(go_r, 1)
            os.write(answer_w, b"%d" % mounts.local(str(root)))
        finally:
            os._exit(0)
    try:
        assert os.read(answer_r, 1) == b"1"
        with mounted_proc(root / "proc"):
            assert not mounts.local(str(root))  # the parent looks first
            os.write(go_w, b"x")
            assert os.read(answer_r, 1) == b"0"  # the child saw the mount too
    finally:
        os.waitpid(pid, 0)
        for fd in (go_r, go_w, answer_r, answer_w):
            os.close(fd)


def test_only_a_small_read_or_listing_runs_on_the_loop(tmp_path: Path) -> None:
    """Twelve clients reading 10 MiB files on the event loop held `/v1/decide` at 327 ms
    median (outsider attack 36): a call big enough to hold the loop goes to a thread."""
    root = tmp_path / "root"
    (root / "many").mkdir(parents=True)
    small, big = root / "small.txt", root / "big.bin"
    small.write_bytes(b"x" * 1000)
    big.write_bytes(b"x" * (LOOP_READ_BYTES + 1))
    os.mkfifo(root / "pipe")
    for i in range(3000):  # ext4 and tmpfs alike: a directory this size is over the bound
        (root / "many" / f"entry-{i:05d}-with-a-longer-name").touch()
    assert loop_sized(FsReadOp(path=str(small)))
    assert not loop_sized(FsReadOp(path=str(big)))
    assert loop_sized(FsReadOp(path=str(big), len=4096))  # the op itself bounds it
    assert loop_sized(FsReadOp(path=str(big), offset=2))  # what is left past the offset
    assert not loop_sized(FsReadOp(path=str(root / "missing")))
    assert not loop_sized(FsReadOp(path=str(root / "pipe")))
    assert loop_sized(FsListOp(path=str(root)))
    assert not loop_sized(FsListOp(path=str(root), depth=2))
    assert not loop_sized(FsListOp(path=str(root / "many")))
    assert not loop_sized(FsWriteOp(path=str(small), bytes_b64="aGk="))
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(POLICY.format(root=root, ws=root / "ws"))
    with Orchestrator(compile_files([policy]), config=EngineConfig(
            state_dir=tmp_path / "state")) as orch:
        gateway = Gateway(orch)
        assert gateway.runs_on_caller(OpKind.FS_READ, str(root), FsReadOp(path=str(small)))
        assert not gateway.runs_on_caller(OpKind.FS_READ, str(root), FsReadOp(path=str(big)))


def test_the_callers_yes_stands_for_the_run_it_was_asked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`/v1/ops` asks ``runs_on_caller`` and runs at once (``on_caller``): the run does not
    read the mount table a second time, but only for the root the yes was about (and the
    backend, kept per kind); every other run asks for itself, as before."""
    from policy_engine.model import Grant, Manifest, Settings
    from tests.integration.service_server import grant, manifest

    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "hello.txt").write_text("hello\n")
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(POLICY.format(root=root, ws=root / "ws"))
    asked: list[str] = []
    real = FsExecutor.stops_by_itself

    def counted(self: FsExecutor, kind: OpKind, root_fs: str) -> bool:
        asked.append(root_fs)
        return real(self, kind, root_fs)

    monkeypatch.setattr(FsExecutor, "stops_by_itself", counted)
    here = threading.current_thread().name
    ran: list[str] = []
    real_execute = FsExecutor.execute

    def noted(self: FsExecutor, ctx: ExecContext, op: Any) -> ExecResult:
        ran.append(threading.current_thread().name)
        return real_execute(self, ctx, op)

    monkeypatch.setattr(FsExecutor, "execute", noted)
    g = Grant.model_validate(grant("acme", "agent:1", root))
    m = Manifest.model_validate(manifest(root))
    op = FsReadOp(path=f"{root}/data/hello.txt")
    with Orchestrator(compile_files([policy]), config=EngineConfig(
            state_dir=tmp_path / "state")) as orch:

        def run(on_caller: str | None) -> None:
            out = orch.run(g, m, op, settings=Settings(root_fs=str(root)), on_caller=on_caller)
            assert out.result.ok, out.result
            assert out.result.out["size"] == 6

        assert orch.runs_on_caller(OpKind.FS_READ, str(root))
        assert asked == [str(root)]
        run(str(root))
        assert asked == [str(root)]  # the yes stood: not asked again
        assert ran == [here]
        run(None)  # no yes given: the run asks for itself
        assert asked == [str(root)] * 2
        run(str(root / "data"))  # a yes about another root than the profile's
        assert asked == [str(root)] * 3
        assert ran == [here] * 3
