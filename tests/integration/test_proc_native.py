"""The native launcher: built once and cached safely, refused or degraded without gcc, held
launchers in fresh cgroups, and proc reachable through the full orchestrator."""

from __future__ import annotations

import os
import shutil
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
from policy_engine.model import ExecResult, ProcExecOp
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


def test_the_launcher_is_built_with_musl_where_it_is_installed(tmp_path: Path) -> None:
    """CI installs musl-tools: a glibc program's start costs ~0.5 ms of CPUID traps on a VM, and
    the launcher is exec'ed inside every sandbox on the call's path (docs/benchmarks.md)."""
    assert shutil.which("musl-gcc") is not None, "scripts/lib/system-deps.sh installs musl-tools"
    built = native.launcher(tmp_path / "bin")
    assert built.path is not None, built.reason
    image = Path(built.path).read_bytes()
    assert b"No error information" in image  # musl's strerror table; glibc says "Unknown error"
    assert b"GNU C Library" not in image


def test_without_musl_gcc_builds_it_and_the_two_builds_are_two_cache_entries(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gcc_only = tmp_path / "gcc-only"
    gcc_only.mkdir()
    for tool in ("gcc", "as", "ld"):  # gcc's own tool chain, without musl-gcc
        (gcc_only / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    cache = tmp_path / "bin"
    with_musl = native.launcher(cache)
    monkeypatch.setenv("PATH", str(gcc_only))
    native._cache.pop(cache.absolute())
    with_gcc = native.launcher(cache)
    assert with_musl.path is not None, with_musl.reason
    assert with_gcc.path is not None, with_gcc.reason
    assert with_gcc.path != with_musl.path  # a host that gains musl later builds it again
    assert b"No error information" not in Path(with_gcc.path).read_bytes()


@pytest.mark.parametrize("held", [0, 2])
def test_the_launcher_runs_programs_as_glibc_execvp_does(root: Path, held: int) -> None:
    """musl's execvp has no /bin/sh fallback for a script without ``#!`` and another default
    PATH; the launcher keeps glibc's rules whichever C library built it."""
    script = root / "no-shebang.sh"
    script.write_text('echo "ran by sh: $0 $1"\nexit 7\n')
    script.chmod(0o755)
    closed = root / "closed.sh"
    closed.write_text("#!/bin/sh\necho never\n")
    closed.chmod(0o644)
    ex = ProcExecutor("bwrap", ProcOptions(prespawn=held))
    try:
        def run(tool: str, *args: str) -> ExecResult:
            ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
            return ex.execute(ctx, ProcExecOp(tool=tool, args=args))

        res = run(str(script), "arg1")
        assert res.out["isolation"]["launcher"] == "native"
        assert res.out["exit_code"] == 7, res.out
        assert res.out["stdout"].strip() == f"ran by sh: {script} arg1"
        missing = run(f"pe-missing-{uuid.uuid4().hex[:8]}")
        assert missing.out["exit_code"] == 127, missing.out
        assert "cannot execute" in missing.out["stderr"]
        assert "No such file or directory" in missing.out["stderr"]
        on_path = run("sh", "-c", 'echo "$0"')  # found on the sandbox's PATH
        assert on_path.out["exit_code"] == 0, on_path.out
        assert on_path.out["stdout"].strip() == "sh"
        refused = run(str(closed))
        assert refused.out["exit_code"] == 126, refused.out
        assert "Permission denied" in refused.out["stderr"]
    finally:
        ex.close()
