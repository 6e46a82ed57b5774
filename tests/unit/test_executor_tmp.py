"""The `tmp` executor: 0700 unique spaces, tmpfs and accounting quotas, release on close/exit."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_tmp.executor import TmpExecutor, TmpOptions
from plugins.executor_tmp.plugin import policy_engine_executors
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext, Executor
from policy_engine.model import (
    AllowLists,
    Budget,
    CapabilityKind,
    DenyLists,
    Limits,
    Mappings,
    NetworkMode,
    Profile,
    ProfileCapability,
    SafetyClass,
    SideEffect,
    TmpAllocOp,
    TmpCapability,
)


def make_profile(tmp_dir: Path, max_bytes: int | None = 1 << 20, grant: bool = True) -> Profile:
    caps = (ProfileCapability(kind=CapabilityKind.TMP_USE,
                              all_of=(TmpCapability(max_bytes=max_bytes),)),) if grant else ()
    return Profile(
        tenant="t", subject_id="agent:a", tool_name="scratch", call_id="c1", capabilities=caps,
        safety=SafetyClass.LOW, side_effects=(SideEffect.FILESYSTEM,), limits=Limits(),
        budget=Budget(), allow=AllowLists(), deny=DenyLists(),
        mappings=Mappings(root_fs=str(tmp_dir), tmp_dir=str(tmp_dir / "pe-tmp")),
        network=NetworkMode.OFF, timeout_ms=10_000, consent_required=False, expires_at=0,
        policy_name="p", policy_version="1", policy_version_hash="h", manifest_version="1",
    )


def ctx_for(tmp_dir: Path, **kw: Any) -> ExecContext:
    return ExecContext(profile=make_profile(tmp_dir, **kw), deadline=time.monotonic() + 30)


def mounted(path: str) -> bool:
    with open("/proc/self/mounts") as fh:
        return any(line.split()[1] == path for line in fh)


def fill(path: str, size: int) -> int:
    """Write ``size`` bytes page by page; return the errno that stopped it (0 if none)."""
    try:
        with open(path, "wb") as fh:
            for _ in range(size // 4096):
                fh.write(b"x" * 4096)
                fh.flush()
    except OSError as err:
        return err.errno or -1
    return 0


@pytest.mark.parametrize("quota", ["tmpfs", "accounting"])
def test_alloc_is_private_unique_and_released(tmp_path: Path, quota: str) -> None:
    ex = TmpExecutor(TmpOptions(quota=quota))  # type: ignore[arg-type]  # parametrized literal
    ctx = ctx_for(tmp_path)
    a = ex.execute(ctx, TmpAllocOp(size_bytes=64 * 1024)).out
    b = ex.execute(ctx, TmpAllocOp(size_bytes=64 * 1024)).out
    assert a["handle"] != b["handle"]
    assert a["quota"] == quota
    assert stat.S_IMODE(os.stat(a["path"]).st_mode) == 0o700
    assert os.path.dirname(a["path"]) == str(tmp_path / "pe-tmp")
    assert mounted(a["path"]) is (quota == "tmpfs")
    assert ctx.side_effects[0].meta["handle"] == a["handle"]
    Path(a["path"], "f").write_bytes(b"x" * 1000)
    info = ex.release(a["handle"])
    assert info["used_bytes"] >= 1000
    assert not os.path.exists(a["path"])
    assert not mounted(a["path"])
    ex.close()
    assert not os.path.exists(b["path"])
    assert ex.handles() == []


def test_tmpfs_quota_is_enforced_by_the_kernel(tmp_path: Path) -> None:
    ex = TmpExecutor(TmpOptions(quota="tmpfs"))
    space = ex.allocate(make_profile(tmp_path), 64 * 1024)
    assert fill(os.path.join(space.path, "big"), 100 * 4096) == errno.ENOSPC
    ex.close()


def test_accounting_quota_is_checked_explicitly(tmp_path: Path) -> None:
    ex = TmpExecutor(TmpOptions(quota="accounting"))
    space = ex.allocate(make_profile(tmp_path), 8 * 1024)
    assert ex.check(space.handle) == 0
    Path(space.path, "big").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(PolicyEngineError) as exc:
        ex.check(space.handle)
    assert exc.value.code == ErrorCode.BUDGET_EXCEEDED
    assert ex.release(space.handle)["over_quota"] is True


def test_release_does_not_follow_planted_symlinks(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep")
    ex = TmpExecutor(TmpOptions(quota="accounting"))
    space = ex.allocate(make_profile(tmp_path), 4096)
    os.symlink(victim, os.path.join(space.path, "link"))
    ex.release(space.handle)
    assert (victim / "keep").read_text() == "keep"


def test_size_above_capability_or_without_grant_is_blocked(tmp_path: Path) -> None:
    ex = TmpExecutor(TmpOptions(max_bytes=1 << 30))
    with pytest.raises(PolicyEngineError) as exc:
        ex.execute(ctx_for(tmp_path, max_bytes=1000), TmpAllocOp(size_bytes=1001))
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED
    with pytest.raises(PolicyEngineError) as exc:
        ex.execute(ctx_for(tmp_path, grant=False), TmpAllocOp(size_bytes=1))
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED
    with pytest.raises(PolicyEngineError) as exc:
        TmpExecutor(TmpOptions(max_bytes=10)).execute(ctx_for(tmp_path, max_bytes=None),
                                                       TmpAllocOp(size_bytes=11))
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED
    with pytest.raises(PolicyEngineError) as exc:
        ex.release("tmp-unknown")
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED


def test_symlinked_tmp_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "pe-tmp").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PolicyEngineError) as exc:
        TmpExecutor().allocate(make_profile(tmp_path), 10)
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED


def test_spaces_are_released_at_interpreter_exit(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.unit.test_executor_tmp import make_profile
        from plugins.executor_tmp.executor import TmpExecutor
        from pathlib import Path
        ex = TmpExecutor()
        s = ex.allocate(make_profile(Path({str(tmp_path)!r})), 4096)
        print(s.path, s.quota)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[1] in ("tmpfs", "accounting")
    assert not os.path.exists(out[0])
    assert not mounted(out[0])


def test_plugin_validates_options_before_constructing() -> None:
    executors = policy_engine_executors(EngineConfig(options={"tmp": {"quota": "accounting"}}))
    assert isinstance(executors[0], Executor)
    with pytest.raises(ValueError, match="quota"):
        policy_engine_executors(EngineConfig(options={"tmp": {"quota": "disk"}}))
    with pytest.raises(ValueError, match="unknown"):
        policy_engine_executors(EngineConfig(options={"tmp": {"size": 1}}))
