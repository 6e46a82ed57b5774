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


FS_ROOTS: dict[Path, Path] = {}
"""The fs root each test directory's profile uses (see ``root``)."""


@pytest.fixture(params=["one-component", "probed", "through-a-link"])
def root(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """The files, seen three ways: one component below the fs root (the guard ``lstat``s it),
    deeper (the openat2 probe's own ``fstat`` answers), and through a symlink (the walk)."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "small.txt").write_bytes(b"12345")
    (tmp_path / "big.txt").write_bytes(b"x" * 100)
    os.mkfifo(tmp_path / "fifo")
    if request.param == "one-component":
        FS_ROOTS[tmp_path] = tmp_path
        return tmp_path
    FS_ROOTS[tmp_path] = tmp_path.parent
    if request.param == "probed":
        return tmp_path
    (tmp_path / "alias").symlink_to(tmp_path)
    FS_ROOTS[tmp_path / "alias"] = tmp_path.parent
    return tmp_path / "alias"


def profile(root: Path, **kw: object) -> Profile:
    real = root.resolve()
    caps = tuple(permit(k, fs(k, f"{real}/**")) for k in ("fs.read", "fs.write", "fs.list"))
    return make_profile(capabilities=caps, root_fs=str(FS_ROOTS.get(root, root)),
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


def test_a_probed_path_is_not_walked_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deeper than one component, the facts come from the probe's own descriptor: no ``lstat``
    runs, and the answer is the same."""
    (tmp_path / "big.txt").write_bytes(b"x" * 100)
    FS_ROOTS[tmp_path] = tmp_path.parent
    calls: list[str] = []

    def no_lstat(path: str) -> os.stat_result:
        calls.append(path)
        raise AssertionError("lstat")

    p, guard = profile(tmp_path), Guard()
    guard.compiled(p)  # compiling resolves the roots once (realpath); decisions walk nothing
    monkeypatch.setattr(os, "lstat", no_lstat)  # every module's (the guard's walk's too)
    d = guard.decide(p, FsReadOp(path=f"{tmp_path}/big.txt"), now_ms=NOW)
    assert (d.decision, d.code) == ("deny", BLOCKED)
    assert guard.decide(p, FsReadOp(path=f"{tmp_path}/no/such"), now_ms=NOW).allowed
    assert calls == []
