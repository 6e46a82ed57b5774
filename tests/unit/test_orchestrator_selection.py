"""Backend selection: config mapping, refuse-or-degrade on missing capabilities, fallback."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator_fixtures import MANIFEST, ScriptedExecutor, grant, orchestrator, profile

from policy_engine.config import EngineConfig
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import (
    CapabilityKind,
    FsCapability,
    NetworkMode,
    OpKind,
    ProcExecOp,
    ProfileCapability,
    TmpAllocOp,
)
from policy_engine.orchestration import required_capabilities, select

FULL = {"resource_limits": True, "env_filtering": True, "bind_mounts": True,
        "readonly_rootfs": True, "mandatory_denies": True}
PROC = frozenset({OpKind.PROC_EXEC})


def test_proc_profile_requirements_depend_on_writable_paths() -> None:
    ro = [r.capability for r in required_capabilities(profile(), OpKind.PROC_EXEC)]
    assert ro == ["network_modes:off", "mandatory_denies", "resource_limits", "env_filtering",
                  "bind_mounts", "readonly_rootfs"]
    writable = profile(capabilities=(ProfileCapability(
        kind=CapabilityKind.FS_WRITE,
        all_of=(FsCapability(kind="fs.write", paths=("/workspace/**",)),)),))
    rw = [r.capability for r in required_capabilities(writable, OpKind.PROC_EXEC)]
    assert "readonly_rootfs" not in rw
    assert "bind_mounts" in rw
    # the HTTP executor is the network client itself: the sandbox network mode does not apply
    assert required_capabilities(profile(), OpKind.NET_HTTP) == []


def test_network_mode_may_be_stricter_but_never_looser() -> None:
    on_caps = {**FULL, "network_modes": frozenset({NetworkMode.ON})}
    only_on = ScriptedExecutor("on", kinds=PROC, caps=on_caps)
    cfg = EngineConfig(state_dir=Path("/nonexistent"), backends={OpKind.PROC_EXEC: "on"})
    sel = select({"on": only_on}, cfg, profile(network=NetworkMode.OFF), OpKind.PROC_EXEC)
    assert sel.error is not None
    assert "`network_modes:off`" in sel.error.reason
    off_only = ScriptedExecutor("off", kinds=PROC, caps=FULL)
    cfg = EngineConfig(state_dir=Path("/nonexistent"), backends={OpKind.PROC_EXEC: "off"})
    sel = select({"off": off_only}, cfg, profile(network=NetworkMode.ON), OpKind.PROC_EXEC)
    assert sel.error is None
    assert sel.executor is off_only


def test_strict_mode_refuses_naming_capability_and_backend(tmp_path: Path) -> None:
    weak = ScriptedExecutor("local-proc", kinds=PROC, caps={"env_filtering": True,
                                                              "mandatory_denies": True})
    with orchestrator(tmp_path, weak) as orch:
        out = orch.run(grant(), MANIFEST, ProcExecOp(tool="ls"))
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert weak.calls == 0
    assert out.result.message == ("blocked by sandbox policy: backend `local-proc` lacks "
                                  "`resource_limits`, `bind_mounts`, `readonly_rootfs` required "
                                  "by the profile")
    end = [json.loads(x) for x in (tmp_path / "evidence" / "evidence.jsonl").read_text()
           .splitlines() if '"checkpoint"' not in x][-1]
    assert end["status"] == "denied"
    assert end["sandbox_backend"] == "local-proc"
    assert orch.meter.used("acme/agent:1/c1") == {}  # a refused call consumes no budget


def test_compat_mode_runs_degraded_and_records_why(tmp_path: Path) -> None:
    weak = ScriptedExecutor("local-proc", kinds=PROC, caps={
        "env_filtering": True, "bind_mounts": True, "mandatory_denies": True})
    with orchestrator(tmp_path, weak, mode="compat") as orch:
        out = orch.run(grant(), MANIFEST, ProcExecOp(tool="ls"))
    assert out.result.ok
    assert weak.calls == 1
    assert out.end.sandbox_degraded is True
    assert out.end.sandbox_degrade_reason == (
        "backend `local-proc` lacks `resource_limits` (the profile limits cpu, memory and "
        "pids); backend `local-proc` lacks `readonly_rootfs` (the profile grants no fs.write)")


def test_mandatory_denies_never_degrade_even_in_compat_mode(tmp_path: Path) -> None:
    weak = ScriptedExecutor("local-proc", kinds=PROC, caps={**FULL, "mandatory_denies": False})
    with orchestrator(tmp_path, weak, mode="compat") as orch:
        out = orch.run(grant(), MANIFEST, ProcExecOp(tool="ls"))
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert weak.calls == 0
    assert "cannot enforce the mandatory denies" in out.result.message
    assert "/run/docker.sock" in out.result.message
    assert "never degrade" in out.result.message
    assert orch.meter.used("acme/agent:1/c1") == {}


def test_unavailable_backend_fails_unless_fallback_to_local(tmp_path: Path) -> None:
    # a configured backend that is loaded but reports itself down: the call fails, or runs
    # on the local backend when the operator allows it (a backend no plugin provides at all
    # is refused when the engine starts: test_plugin_startup.py)
    class Down(ScriptedExecutor):
        def available(self) -> str:
            return "daemon socket missing"

    local = ScriptedExecutor("tmp-local", kinds=frozenset({OpKind.TMP_ALLOC}), local=True)
    backends = {OpKind.TMP_ALLOC: "docker"}
    down = Down("docker", kinds=frozenset({OpKind.TMP_ALLOC}))
    with orchestrator(tmp_path / "a", local, down, backends=backends) as orch:
        out = orch.run(grant(), MANIFEST, TmpAllocOp(size_bytes=1))
    assert out.result.code == "PROVIDER.UNAVAILABLE"
    assert local.calls == 0
    assert out.result.message == ("provider unavailable: backend `docker` is unavailable: "
                                  "daemon socket missing")
    with orchestrator(tmp_path / "b", local, down, backends=backends,
                      fallback_to_local=True) as orch:
        out = orch.run(grant(), MANIFEST, TmpAllocOp(size_bytes=1))
    assert out.result.ok
    assert local.calls == 1
    assert out.end.sandbox_backend == "tmp-local"
    assert out.end.sandbox_degrade_reason == (
        "backend `docker` is unavailable: daemon socket missing; fell back to local backend "
        "`tmp-local`")


def test_backend_reporting_unavailable_is_provider_unavailable(tmp_path: Path) -> None:
    class Down(ScriptedExecutor):
        def available(self) -> str:
            return "daemon socket missing"

    down = Down("docker", kinds=frozenset({OpKind.TMP_ALLOC}))
    with orchestrator(tmp_path, down) as orch:
        out = orch.run(grant(), MANIFEST, TmpAllocOp(size_bytes=1))
    assert out.result.message == ("provider unavailable: backend `docker` is unavailable: "
                                  "daemon socket missing")
    assert out.end.status == "error"
    assert down.calls == 0


def test_unconfigured_kind_prefers_the_first_party_default_over_load_order() -> None:
    from policy_engine.config import DEFAULT_BACKENDS

    # docker loads first, but without configuration proc.exec goes to the bwrap backend;
    # a configured backend is honoured exactly
    executors = {"docker": ScriptedExecutor("docker", kinds=PROC, caps=FULL),
                 "proc-bwrap": ScriptedExecutor("proc-bwrap", kinds=PROC, caps=FULL)}
    assert DEFAULT_BACKENDS[OpKind.PROC_EXEC] == "proc-bwrap"
    chosen = select(executors, EngineConfig(), profile(), OpKind.PROC_EXEC)
    assert chosen.backend == "proc-bwrap"
    configured = EngineConfig(backends={OpKind.PROC_EXEC: "docker"})
    assert select(executors, configured, profile(), OpKind.PROC_EXEC).backend == "docker"


def test_a_missing_default_backend_is_refused_not_replaced() -> None:
    """No `backends:` entry and the first-party default (proc-bwrap) not loaded: another
    executor serving proc.exec is never chosen in its place (seed 004: no silent switch)."""
    other = ScriptedExecutor("other", kinds=PROC, caps=FULL)
    sel = select({"other": other}, EngineConfig(state_dir=Path("/nonexistent")), profile(),
                 OpKind.PROC_EXEC)
    assert sel.executor is None
    assert sel.error is not None
    assert sel.error.code.value == "PROVIDER.UNAVAILABLE"
    assert "default backend `proc-bwrap`" in sel.error.reason
    assert other.calls == 0


class _Refusing(ScriptedExecutor):
    """An executor refusing from the profile and op alone (the SPI's optional ``refusal``)."""

    def __init__(self, name: str, refuse: Exception | None) -> None:
        super().__init__(name, kinds=PROC, caps=FULL)
        self.refuse = refuse

    def refusal(self, prof: object, op: object) -> PolicyEngineError | None:
        if isinstance(self.refuse, PolicyEngineError) or self.refuse is None:
            return self.refuse
        raise self.refuse


def test_the_executors_own_refusal_is_the_selections_and_the_run_reports_a_deny(
        tmp_path: Path) -> None:
    """Outsider round 5 F06: the run (and a dry run) asks the chosen executor's ``refusal``;
    the call is a deny with its code, the executor is never called, no budget is charged."""
    refusing = _Refusing("picky", PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "not here"))
    cfg = EngineConfig(state_dir=Path("/nonexistent"), backends={OpKind.PROC_EXEC: "picky"})
    op = ProcExecOp(tool="ls")
    assert select({"picky": refusing}, cfg, profile(), OpKind.PROC_EXEC).error is None  # no op
    sel = select({"picky": refusing}, cfg, profile(), OpKind.PROC_EXEC, op)
    assert sel.executor is None
    assert sel.error is not None
    assert (sel.error.code, sel.error.reason) == (ErrorCode.CAPABILITY_BLOCKED, "not here")
    assert sel.error.audit["backend"] == "picky"
    with orchestrator(tmp_path, refusing) as orch:
        out = orch.run(grant(), MANIFEST, op)
    assert refusing.calls == 0
    assert (out.decision.decision, out.decision.code) == ("deny", "SANDBOX.CAPABILITY_BLOCKED")
    assert out.decision.reason == "not here"
    assert out.decision.rule is None
    assert out.end.budget_used.calls == 0


def test_a_refusal_check_that_crashes_refuses_the_call() -> None:
    broken = _Refusing("broken", RuntimeError("boom"))
    cfg = EngineConfig(state_dir=Path("/nonexistent"), backends={OpKind.PROC_EXEC: "broken"})
    sel = select({"broken": broken}, cfg, profile(), OpKind.PROC_EXEC, ProcExecOp(tool="ls"))
    assert sel.error is not None
    assert sel.error.code == ErrorCode.PROVIDER_UNAVAILABLE
    assert "could not check the call: RuntimeError: boom" in sel.error.reason
