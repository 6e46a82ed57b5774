"""Guard step 8b (fsfacts.py): what the fs executor will find at the resolved path, decided by the
guard with the executor's code; and the switches that keep it out of pure policy questions."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from policy_engine.guard import Guard
from policy_engine.model import FsListOp, FsReadOp, FsWriteOp, Limits, Profile
from tests.unit.guard_fixtures import NOW, fs, make_profile, permit

BLOCKED = "SANDBOX.CAPABILITY_BLOCKED"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "dir").mkdir()
    (tmp_path / "small.txt").write_bytes(b"12345")
    (tmp_path / "big.txt").write_bytes(b"x" * 100)
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


def profile(root: Path, **kw: object) -> Profile:
    caps = tuple(permit(k, fs(k, f"{root}/**")) for k in ("fs.read", "fs.write", "fs.list"))
    return make_profile(capabilities=caps, root_fs=str(root),
                        limits=Limits(max_bytes_in=64), **kw)  # type: ignore[arg-type]


def w(path: Path, overwrite: bool) -> FsWriteOp:
    return FsWriteOp(path=str(path), bytes_b64=base64.b64encode(b"y").decode(),
                     overwrite=overwrite)


@pytest.mark.parametrize(("op", "words"), [
    (lambda r: FsReadOp(path=f"{r}/dir"), "is not a regular file"),
    (lambda r: FsReadOp(path=f"{r}/fifo"), "is not a regular file"),
    (lambda r: FsReadOp(path=f"{r}/big.txt"), "is larger than max_bytes_in 64 (set by profile)"),
    (lambda r: w(r / "small.txt", overwrite=False), "exists and overwrite is false"),
    (lambda r: w(r / "dir", overwrite=True), "exists and is not a regular file"),
    (lambda r: w(r / "fifo", overwrite=True), "exists and is not a regular file"),
])
def test_refused_with_the_executors_code(root: Path, op: object, words: str) -> None:
    d = Guard().decide(profile(root), op(root), now_ms=NOW)  # type: ignore[operator]
    assert (d.decision, d.code) == ("deny", BLOCKED)
    assert words in d.reason
    traced = Guard().decide(profile(root), op(root), now_ms=NOW, trace=True)  # type: ignore[operator]
    assert traced.trace is not None
    assert any(s.node == "resource" and s.outcome == "fail" for s in traced.trace)


@pytest.mark.parametrize("op", [
    lambda r: FsReadOp(path=f"{r}/small.txt"),
    lambda r: FsReadOp(path=f"{r}/big.txt", len=10),  # a bounded read fits
    lambda r: FsReadOp(path=f"{r}/missing.txt"),  # a missing file is the run's to find
    lambda r: w(r / "small.txt", overwrite=True),
    lambda r: w(r / "new.txt", overwrite=False),
    lambda r: FsListOp(path=f"{r}/small.txt"),  # fs.list of a file fails at run, not a policy
])
def test_what_the_executor_accepts_stays_allowed(root: Path, op: object) -> None:
    assert Guard().decide(profile(root), op(root), now_ms=NOW).allowed  # type: ignore[operator]


def test_policy_refusals_are_reported_before_disk_facts(root: Path) -> None:
    """Consent is step 8, the disk step 8b: a missing consent is what explain reports."""
    d = Guard().decide(profile(root, consent_required=True), FsReadOp(path=f"{root}/dir"),
                     now_ms=NOW)
    assert d.code == "SANDBOX.PERMISSION_DENY"
    assert "consent" in d.reason


def test_switches_leave_the_disk_out(root: Path) -> None:
    op = FsReadOp(path=f"{root}/dir")
    assert Guard(fs_facts=False).decide(profile(root), op, now_ms=NOW).allowed
    assert Guard(resolve_symlinks=False).decide(profile(root), op, now_ms=NOW).allowed
    guard = Guard()
    twin = guard.policy_only()  # the fs listing filter asks the policy, not the disk
    assert twin.decide(profile(root), op, now_ms=NOW).allowed
    assert not guard.decide(profile(root), op, now_ms=NOW).allowed  # the original unchanged
