"""The proc sandbox plan, the bwrap argv, the seccomp program, backend probes and plugin options."""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

import pytest

from plugins.executor_proc import bwrap, landlock, seccomp
from plugins.executor_proc.executor import ProcExecutor
from plugins.executor_proc.plugin import policy_engine_executors
from plugins.executor_proc.spec import build_plan, carve
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.config import EngineConfig
from policy_engine.executor import CancelToken, ExecContext, Executor
from policy_engine.model import NetworkMode, ProcExecOp
from tests.integration.test_proc_sandbox import make_profile

PY = sys.executable


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "out").mkdir(parents=True)
    (r / "home" / ".ssh").mkdir(parents=True)
    (r / "home" / ".ssh" / "id_rsa").write_text("k")
    (r / "a" / "b").mkdir(parents=True)
    (r / "a" / "b" / ".env").write_text("x")
    return r


def test_plan_binds_masks_and_literal_prefixes(root: Path) -> None:
    plan = build_plan(make_profile(root), ProcExecOp(tool="true"))
    assert plan.writable == [str(root / "out")]
    assert plan.readable == [str(root)]
    assert str(root / "home" / ".ssh") in plan.mask_dirs
    assert str(root / "a" / "b" / ".env") in plan.mask_files
    assert "/etc/shadow" in plan.mask_files
    assert plan.cwd == str(root)
    assert plan.env["HOME"] == str(root / "home")


def test_bwrap_argv_orders_binds_then_masks_and_never_uses_a_shell(root: Path) -> None:
    plan = build_plan(make_profile(root), ProcExecOp(tool="echo", args=("a; rm -rf /",)))
    argv = bwrap.build_argv("/usr/bin/bwrap", plan, inner=plan.argv, launcher_src=None)
    for flag in ("--unshare-all", "--unshare-pid", "--die-with-parent", "--new-session",
                 "--clearenv"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--share-net" not in argv
    assert argv[-3:] == ["--", "echo", "a; rm -rf /"]
    ro, rw = argv.index(str(root)) - 1, argv.index(str(root / "out")) - 1
    assert argv[ro] == "--ro-bind"
    assert argv[rw] == "--bind"
    assert rw > ro  # the writable child is mounted over the read-only parent
    mask = argv.index(str(root / "home" / ".ssh"))
    assert mask > rw
    assert argv[mask - 1] == "--tmpfs"
    on = build_plan(make_profile(root, NetworkMode.ON), ProcExecOp(tool="true"))
    assert "--share-net" in bwrap.build_argv("/usr/bin/bwrap", on, inner=["true"],
                                             launcher_src=None)


def test_network_hook_is_the_extension_point_for_restricted_mode(root: Path) -> None:
    plan = build_plan(make_profile(root, NetworkMode.RESTRICTED), ProcExecOp(tool="true"))
    argv = bwrap.build_argv("/usr/bin/bwrap", plan, inner=["true"], launcher_src=None,
                            network_hook=lambda p: ["--setenv", "HTTPS_PROXY", "unix:/run/p"])
    assert "--share-net" not in argv
    assert "HTTPS_PROXY" in argv
    assert NetworkMode.RESTRICTED in ProcExecutor("bwrap").capabilities.network_modes
    assert NetworkMode.RESTRICTED not in ProcExecutor("landlock").capabilities.network_modes


def test_restricted_runs_behind_the_proxy_and_a_hook_replaces_it(root: Path) -> None:
    ctx = ExecContext(profile=make_profile(root, NetworkMode.RESTRICTED),
                      deadline=time.monotonic() + 60)
    res = ProcExecutor("bwrap").execute(ctx, ProcExecOp(tool="printenv", args=("HTTPS_PROXY",)))
    assert res.out["network"] == res.out["network_requested"] == "restricted"
    assert res.out["stdout"].strip() == "http://127.0.0.1:3128"
    hooked = ProcExecutor("bwrap", network_hook=lambda p: ["--setenv", "HTTPS_PROXY", "hook"])
    res = hooked.execute(ctx, ProcExecOp(tool="printenv", args=("HTTPS_PROXY",)))
    assert res.out["stdout"].strip() == "hook"


def test_landlock_carves_around_masked_paths(root: Path) -> None:
    rules = dict(carve(str(root), "rox", [str(root / "home" / ".ssh")]))
    assert rules[str(root)] == "list"
    assert rules[str(root / "home")] == "list"
    assert rules[str(root / "out")] == "rox"
    assert str(root / "home" / ".ssh") not in rules


def test_seccomp_program_shape() -> None:
    prog = seccomp.build_filter(deny_inet=True, deny_setsid=True)
    assert len(prog) % 8 == 0
    assert len(prog) // 8 < 4096  # BPF_MAXINSNS
    code, _, _, k = struct.unpack("=HBBI", prog[-8:])
    assert (code, k) == (0x06, 0x7FFF0000)  # default: allow


def test_landlock_backend_reports_unavailability(monkeypatch: pytest.MonkeyPatch,
                                                 root: Path) -> None:
    # a mock only because Landlock cannot be switched off in the running kernel (ABI > 0 here)
    assert landlock.abi_version() > 0
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    ex = ProcExecutor("landlock")
    assert ex.usable is False
    assert ex.available() == ex.unavailable_reason
    assert "landlock is not enabled" in ex.unavailable_reason
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
    with pytest.raises(PolicyEngineError) as exc:
        ex.execute(ctx, ProcExecOp(tool="true"))
    assert exc.value.code == ErrorCode.PROVIDER_UNAVAILABLE


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
def test_unknown_tool_exits_127(root: Path, backend: str) -> None:
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
    res = ProcExecutor(backend).execute(ctx, ProcExecOp(tool="no-such-tool-pe"))
    assert res.out["exit_code"] in (126, 127)
    assert "no-such-tool-pe" in res.out["stderr"]


def test_missing_bwrap_is_provider_unavailable(monkeypatch: pytest.MonkeyPatch, root: Path,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a real PATH without bwrap on it
    ex = ProcExecutor("bwrap")
    assert ex.usable is False
    assert ex.available() == ex.unavailable_reason
    assert "not installed" in ex.unavailable_reason
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
    with pytest.raises(PolicyEngineError) as exc:
        ex.execute(ctx, ProcExecOp(tool="true"))
    assert exc.value.code == ErrorCode.PROVIDER_UNAVAILABLE


def test_cancel_token_stops_a_running_process(root: Path) -> None:
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
    ctx.cancel = CancelToken()
    ctx.cancel.cancel("user abort")
    with pytest.raises(PolicyEngineError) as exc:
        ProcExecutor("bwrap").execute(ctx, ProcExecOp(tool="sleep", args=("30",)))
    assert exc.value.code == ErrorCode.TIMEOUT


def test_plugin_validates_options_and_declares_capabilities() -> None:
    executors = policy_engine_executors(EngineConfig(options={"proc": {"env_allow": ["CI"]}}))
    assert [e.name for e in executors] == ["proc-bwrap", "proc-landlock", "proc-unshare"]
    assert all(isinstance(e, Executor) for e in executors)
    bw, ll, un = (e.capabilities for e in executors)
    assert un == ll  # proc-unshare adds namespaces, not a view: it declares what Landlock does
    assert bw.bind_mounts
    assert not ll.bind_mounts
    assert bw.network_modes == {NetworkMode.OFF, NetworkMode.RESTRICTED, NetworkMode.ON}
    assert ll.network_modes == {NetworkMode.OFF, NetworkMode.ON}
    assert bw.env_filtering
    assert bw.resource_limits
    for bad in ({"env_allow": "CI"}, {"extra_ro_binds": ["rel"]}, {"layer2": "yes"},
                {"extra_ro_binds": ["/tmp/tools"]}, {"extra_ro_binds": ["/tmp"]},
                {"env_base": {"HOME": "/x"}}, {"nope": 1}, {"scan_limit": 0}):
        with pytest.raises(ValueError, match="proc"):
            policy_engine_executors(EngineConfig(options={"proc": bad}))
