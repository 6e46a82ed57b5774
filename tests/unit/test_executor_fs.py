"""The `fs` executor: no-follow resolution (openat2 and the walk), size limits, atomic writes."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_fs.executor import FsExecutor, FsOptions
from plugins.executor_fs.plugin import policy_engine_executors
from plugins.executor_fs.resolve import openat2_available
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext, Executor
from policy_engine.model import (
    AllowLists,
    Budget,
    CapabilityKind,
    DenyLists,
    FsCapability,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Limits,
    Mappings,
    NetworkMode,
    Profile,
    ProfileDeny,
    RuleRef,
    SafetyClass,
    SideEffect,
)

RESOLVERS = [pytest.param(True, id="openat2"), pytest.param(False, id="openat-walk")]


def make_profile(root: Path, **limits: Any) -> Profile:
    deny = ProfileDeny(
        kinds=(CapabilityKind.FS_READ, CapabilityKind.FS_WRITE),
        capability=FsCapability(kind="fs.read", paths=("**/.env",)),
        rule=RuleRef(id="secrets", file="system", line=1, column=1), mandatory=True,
    )
    return Profile(
        tenant="t", subject_id="agent:a", tool_name="files", call_id="c1",
        denies=(deny,), safety=SafetyClass.LOW, side_effects=(SideEffect.READ,),
        limits=Limits(**limits), budget=Budget(), allow=AllowLists(), deny=DenyLists(),
        mappings=Mappings(root_fs=str(root), tmp_dir=str(root / "tmp"), home=str(root / "home")),
        network=NetworkMode.OFF, timeout_ms=10_000, consent_required=False, expires_at=0,
        policy_name="p", policy_version="1", policy_version_hash="h", manifest_version="1",
    )


def ctx_for(root: Path, **limits: Any) -> ExecContext:
    return ExecContext(profile=make_profile(root, **limits), deadline=time.monotonic() + 30)


def fs(openat2: bool, preview: int = 64 * 1024) -> FsExecutor:
    if openat2:
        assert openat2_available(), "openat2 is expected on this kernel (6.x)"
    return FsExecutor(FsOptions(preview_bytes=preview, use_openat2=openat2))


def code_of(exc: pytest.ExceptionInfo[PolicyEngineError]) -> ErrorCode:
    return exc.value.code


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_read_returns_digest_preview_and_records_no_content(tmp_path: Path, openat2: bool) -> None:
    (tmp_path / "a.txt").write_bytes(b"hello world")
    ctx = ctx_for(tmp_path)
    res = fs(openat2, preview=5).execute(ctx, FsReadOp(path=str(tmp_path / "a.txt")))
    assert res.ok
    assert res.out["size"] == 11
    assert base64.b64decode(res.out["bytes_b64"]) == b"hello"
    assert res.out["preview_truncated"] is True
    assert res.out["digest"]["size"] == 11
    assert res.out["resolver"] == ("openat2" if openat2 else "openat-walk")
    assert ctx.side_effects[0].meta == {"op": "fs.read", "path": str(tmp_path / "a.txt"),
                                        "bytes": 11}


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_read_offset_and_len(tmp_path: Path, openat2: bool) -> None:
    (tmp_path / "a.txt").write_bytes(b"0123456789")
    res = fs(openat2).execute(ctx_for(tmp_path), FsReadOp(path=str(tmp_path / "a.txt"),
                                                           offset=3, len=4))
    assert base64.b64decode(res.out["bytes_b64"]) == b"3456"


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_symlink_swapped_in_after_guard_cannot_escape(tmp_path: Path, openat2: bool) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "f.txt").write_text("inside")
    (outside / "f.txt").write_text("SECRET")
    path = str(root / "sub" / "f.txt")
    # the guard saw a real file; now a component is swapped for a symlink out of the root
    (root / "sub" / "f.txt").unlink()
    (root / "sub").rmdir()
    (root / "sub").symlink_to(outside)
    for op in (FsReadOp(path=path), FsWriteOp(path=path, overwrite=True),
               FsListOp(path=str(root / "sub"))):
        with pytest.raises(PolicyEngineError) as exc:
            fs(openat2).execute(ctx_for(root), op)
        assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED
    assert (outside / "f.txt").read_text() == "SECRET"


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_final_symlink_and_absolute_escape_refused(tmp_path: Path, openat2: bool) -> None:
    (tmp_path / "passwd").symlink_to("/etc/passwd")
    for path in (str(tmp_path / "passwd"), "/etc/passwd", str(tmp_path) + "-evil/x",
                 str(tmp_path / "a" / ".." / ".." / "etc")):
        with pytest.raises(PolicyEngineError) as exc:
            fs(openat2).execute(ctx_for(tmp_path), FsReadOp(path=path))
        assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED


def test_mandatory_deny_rechecked_by_executor(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TOKEN=1")
    with pytest.raises(PolicyEngineError) as exc:
        fs(False).execute(ctx_for(tmp_path), FsReadOp(path=str(tmp_path / ".env")))
    assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_read_over_max_bytes_in_is_blocked(tmp_path: Path, openat2: bool) -> None:
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(PolicyEngineError) as exc:
        fs(openat2).execute(ctx_for(tmp_path, max_bytes_in=100),
                            FsReadOp(path=str(tmp_path / "big")))
    assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED
    res = fs(openat2).execute(ctx_for(tmp_path, max_bytes_in=101),
                              FsReadOp(path=str(tmp_path / "big")))
    assert res.out["size"] == 101


def test_fifo_is_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(PolicyEngineError) as exc:
        fs(True).execute(ctx_for(tmp_path), FsReadOp(path=str(tmp_path / "pipe")))
    assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_write_is_atomic_and_respects_overwrite(tmp_path: Path, openat2: bool) -> None:
    path = str(tmp_path / "out.txt")
    data = base64.b64encode(b"v1").decode()
    ctx = ctx_for(tmp_path)
    res = fs(openat2).execute(ctx, FsWriteOp(path=path, bytes_b64=data))
    assert res.out["size"] == 2
    assert res.used.bytes_out == 2
    assert ctx.side_effects[0].meta["bytes"] == 2
    assert "content" not in ctx.side_effects[0].meta
    with pytest.raises(PolicyEngineError) as exc:
        fs(openat2).execute(ctx, FsWriteOp(path=path, bytes_b64=base64.b64encode(b"v2").decode()))
    assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED
    fs(openat2).execute(ctx, FsWriteOp(path=path, bytes_b64=base64.b64encode(b"v2").decode(),
                                       overwrite=True))
    assert Path(path).read_bytes() == b"v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temp file left


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_write_over_max_bytes_out_refused_before_writing(tmp_path: Path, openat2: bool) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        fs(openat2).execute(ctx_for(tmp_path, max_bytes_out=3), FsWriteOp(
            path=str(tmp_path / "x"), bytes_b64=base64.b64encode(b"1234").decode()))
    assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED
    assert list(tmp_path.iterdir()) == []


def test_write_never_replaces_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(target)
    with pytest.raises(PolicyEngineError) as exc:
        fs(True).execute(ctx_for(tmp_path / "root"), FsWriteOp(
            path=str(tmp_path / "root" / "link"), bytes_b64="", overwrite=True))
    assert code_of(exc) == ErrorCode.CAPABILITY_BLOCKED
    assert target.read_text() == "keep"


def test_write_rejects_bad_base64(tmp_path: Path) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        fs(True).execute(ctx_for(tmp_path), FsWriteOp(path=str(tmp_path / "x"), bytes_b64="*"))
    assert code_of(exc) == ErrorCode.SCHEMA_VALIDATION_FAILED


@pytest.mark.parametrize("openat2", RESOLVERS)
def test_list_honours_depth_and_max_files(tmp_path: Path, openat2: bool) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "f1").write_text("1")
    (tmp_path / "ln").symlink_to("/etc")
    res = fs(openat2).execute(ctx_for(tmp_path), FsListOp(path=str(tmp_path), depth=2))
    assert [(e["path"], e["type"]) for e in res.out["entries"]] == [
        ("a", "dir"), ("a/b", "dir"), ("f1", "file"), ("ln", "symlink")]
    assert res.out["truncated"] is False
    capped = fs(openat2).execute(ctx_for(tmp_path, max_depth=1, max_files=2),
                                 FsListOp(path=str(tmp_path), depth=5))
    assert capped.out["depth"] == 1
    assert capped.out["count"] == 2
    assert capped.out["truncated"]


def test_expired_deadline_is_a_timeout(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    ctx = ExecContext(profile=make_profile(tmp_path), deadline=time.monotonic() - 1)
    with pytest.raises(PolicyEngineError) as exc:
        fs(True).execute(ctx, FsReadOp(path=str(tmp_path / "a")))
    assert code_of(exc) == ErrorCode.TIMEOUT


def test_plugin_validates_options_before_constructing() -> None:
    executors = policy_engine_executors(EngineConfig(options={"fs": {"preview_bytes": 10}}))
    assert isinstance(executors[0], Executor)
    assert executors[0].capabilities.op_kinds
    with pytest.raises(ValueError, match="preview_bytes"):
        policy_engine_executors(EngineConfig(options={"fs": {"preview_bytes": -1}}))
    with pytest.raises(ValueError, match="unknown"):
        policy_engine_executors(EngineConfig(options={"fs": {"bogus": 1}}))
