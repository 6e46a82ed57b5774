"""The native launcher: built once and cached safely, refused or degraded without gcc, held
launchers in fresh cgroups, and proc reachable through the full orchestrator."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from plugins.executor_proc import native
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.orchestrator import Orchestrator
from tests.integration.test_proc_sandbox import leftovers, make_profile

pytestmark = pytest.mark.integration

SECCOMP_PROBE = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    print(libc.unshare(0x10000000), ctypes.get_errno())
""")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "out").mkdir(parents=True)
    (r / "home").mkdir()
    return r


def test_launcher_is_built_once_into_a_private_cache(tmp_path: Path) -> None:
    cache = tmp_path / "bin"
    first = native.launcher(cache)
    assert first.path is not None, first.reason
    assert Path(first.path).name.startswith("sb_launch-")
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert native.launcher(cache) is first  # once per process
    assert [p.name for p in cache.iterdir()] == [Path(first.path).name]  # no temp left over
    # another process (a fresh cache entry) finds the built binary without gcc
    native._cache.pop(cache.absolute())
    assert native.launcher(cache).path == first.path


def test_a_cache_others_can_write_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)  # whoever can swap the binary would own every sandbox
    found = native.launcher(cache)
    assert found.path is None
    assert "writable by another user" in found.reason


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
def test_without_gcc_strict_refuses_and_compat_degrades_to_the_python_launcher(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, root: Path, backend: str) -> None:
    empty = tmp_path / "nogcc"
    empty.mkdir()
    bwrap_dir = tmp_path / "bwrap-only"
    bwrap_dir.mkdir()
    (bwrap_dir / "bwrap").symlink_to("/usr/bin/bwrap")
    monkeypatch.setenv("PATH", str(bwrap_dir))  # bwrap is found, gcc and cc are not
    opts = ProcOptions(launcher_cache=str(tmp_path / "cache"))
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
    op = ProcExecOp(tool=sys.executable, args=("-c", SECCOMP_PROBE))
    strict = ProcExecutor(backend, opts)
    with pytest.raises(PolicyEngineError) as exc:
        strict.execute(ctx, op)
    assert exc.value.code == ErrorCode.PROVIDER_UNAVAILABLE
    assert "gcc is not installed" in exc.value.reason
    strict.close()

    compat = ProcExecutor(backend, opts, mode="compat")
    res = compat.execute(ctx, op)
    compat.close()
    assert res.out["isolation"]["launcher"] == "python"
    assert "gcc is not installed" in res.out["degraded"][0]
    assert res.out["isolation"]["seccomp"].startswith("enforced")  # same rules, slower
    assert res.out["stdout"].split() == ["-1", "1"]


@pytest.mark.parametrize("prespawn", [0, 2])
def test_native_launcher_enforces_and_reports_with_or_without_held_launchers(
        root: Path, prespawn: int) -> None:
    ex = ProcExecutor("bwrap", ProcOptions(prespawn=prespawn))
    try:
        marker = f"pe-bomb-{uuid.uuid4().hex}"
        for _ in range(3):  # held launchers are used once each, with a fresh cgroup each
            ctx = ExecContext(profile=make_profile(root, pids=16),
                              deadline=time.monotonic() + 60)
            res = ex.execute(ctx, ProcExecOp(tool=sys.executable, args=("-c", textwrap.dedent(
                """
                import os, time
                ok = 0
                for _ in range(64):
                    try:
                        if os.fork() == 0:
                            time.sleep(30)
                            os._exit(0)
                        ok += 1
                    except OSError:
                        pass
                print(ok)
                """), marker)))
            assert res.out["isolation"]["launcher"] == "native"
            assert res.out["isolation"]["landlock"].startswith("enforced")
            assert res.out["isolation"]["seccomp"].startswith("enforced")
            assert "pids.max=16" in res.out["limits"]["pids"]
            assert int(res.out["stdout"]) < 16
            assert leftovers(marker) == []
    finally:
        ex.close()


def test_proc_runs_through_the_full_orchestrator(tmp_path: Path) -> None:
    (tmp_path / "p.sbpolicy").write_text(
        'policy "t/proc" version "1.0.0"\n'
        "defaults {\n  timeout 30s\n  network off\n}\n"
        'permit "true" proc.exec  tool "true"  args []\n')
    (tmp_path / "g.json").write_text(
        '{"tenant": "t", "subject_id": "agent:t", "tool_name": "shell", "call_id": "c1",'
        ' "capabilities": [{"kind": "proc.exec", "tool": "true"}], "expires_at": 4102444800000,'
        ' "budget": {"calls": 10}, "consent": {"granted_by": "user:u", "granted_at": 1,'
        ' "expires_at": 4102444800000}}')
    (tmp_path / "m.json").write_text(
        '{"name": "shell", "version": "1.0.0", "permissions": [{"kind": "proc.exec",'
        ' "tool": "true"}], "side_effects": ["Process"], "safety_class": "Low"}')
    config = EngineConfig(state_dir=tmp_path / "state", revocation="memory")
    with Orchestrator(compile_files((tmp_path / "p.sbpolicy",)), config=config) as orch:
        out = orch.run(load_grant(tmp_path / "g.json"), load_manifest(tmp_path / "m.json"),
                       ProcExecOp(tool="true"))
    assert out.result.ok, out.result
    assert out.result.out["exit_code"] == 0
    assert out.end.sandbox_backend == "proc-bwrap"
    assert out.end.sandbox_degraded is False
    assert out.result.out["isolation"]["launcher"] == "native"


@pytest.mark.parametrize("prespawn", [0, 2])
def test_without_layer2_the_tool_cannot_forge_the_isolation_status(root: Path,
                                                                   prespawn: int) -> None:
    ex = ProcExecutor("bwrap", ProcOptions(layer2=False, prespawn=prespawn))
    # the sandbox uid's tree: without layer 2 a root-owned one gets no id-mapped bind and is
    # refused in strict mode (issue 26, test_idmapped_binds)
    os.chown(root / "out", 65533, 65533)
    forge = textwrap.dedent("""
        import os
        hit = []
        for fd in range(3, 64):
            try:
                os.write(fd, b'{"landlock": "enforced (forged)"}')
                hit.append(fd)
            except OSError:
                pass
        print(hit)
    """)
    try:
        ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
        res = ex.execute(ctx, ProcExecOp(tool=sys.executable, args=("-c", forge)))
    finally:
        ex.close()
    assert res.out["stdout"].strip() == "[]"  # no inherited descriptor at all
    assert res.out["isolation"]["landlock"] == "off"
