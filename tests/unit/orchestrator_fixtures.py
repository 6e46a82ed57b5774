"""Hand-built profiles, fake guard/builder and test executors for orchestrator and plugin tests.

The fakes stand in for the profile builder and guard only where a test needs a decision the
policy engine would otherwise have to be configured for; executors here are real objects
implementing the Executor protocol.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugins import budget_memory, budget_sqlite, evidence_jsonl, evidence_sqlite
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.graph.policyset import PolicySet
from policy_engine.hookspecs import hookimpl
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    AllowLists,
    Budget,
    Decision,
    DenyLists,
    ExecResult,
    Grant,
    Limits,
    Manifest,
    Mappings,
    NetworkMode,
    OpKind,
    Profile,
    ProfileCapability,
    SafetyClass,
    SideEffect,
    Usage,
)
from policy_engine.orchestration import MemoryRevocationList
from policy_engine.orchestrator import Orchestrator
from policy_engine.plugin_manager import PluginManager

NOW = 1_700_000_000_000

POLICYSET = PolicySet(
    name="test", version="1.0.0", version_hash="ph-test", files=(), defaults=Limits(),
    network=NetworkMode.OFF, rules=(), permits_by_kind={}, forbids_by_kind={},
    consent_rules=(), profiles={}, tools={}, home="/root",
)


def grant(call_id: str = "c1", *, budget: Budget | None = None, expires_at: int = NOW + 60_000,
          fingerprint: str = "") -> Grant:
    return Grant(tenant="acme", subject_id="agent:1", tool_name="t", call_id=call_id,
                 expires_at=expires_at, budget=budget or Budget(),
                 decision_key_fingerprint=fingerprint)


MANIFEST = Manifest(name="t", version="1.0")


def profile(*, budget: Budget | None = None, network: NetworkMode = NetworkMode.OFF,
            timeout_ms: int = 5_000, capabilities: tuple[ProfileCapability, ...] = (),
            name: str | None = None) -> Profile:
    return Profile(
        tenant="acme", subject_id="agent:1", tool_name="t", call_id="c1", name=name,
        capabilities=capabilities, safety=SafetyClass.LOW, side_effects=(SideEffect.READ,),
        limits=SYSTEM_DEFAULT_LIMITS, budget=budget or Budget(), allow=AllowLists(),
        deny=DenyLists(), mappings=Mappings(), network=network, timeout_ms=timeout_ms,
        consent_required=False, expires_at=NOW + 60_000, policy_name="test",
        policy_version="1.0.0", policy_version_hash="ph-test", manifest_version="1.0",
        profile_hash="hash-1",
    )


class FixedBuilder:
    """Returns one prebuilt profile (its budget taken from the grant, like the real meet)."""

    def __init__(self, prof: Profile) -> None:
        self.prof = prof

    def build(self, grant: Grant, manifest: Manifest, *, settings: Any = None,
              overrides: Any = None) -> Profile:
        return self.prof.model_copy(update={"budget": grant.budget})


class ScriptedGuard:
    """Allows everything except ops whose kind is in ``deny`` (with that code)."""

    def __init__(self, deny: Mapping[str, str] | None = None) -> None:
        self.deny = dict(deny or {})

    def decide(self, profile: Profile, op: Any, *, context: Any = None, now_ms: Any = None,
               trace: bool = False) -> Decision:
        if op.kind in self.deny:
            return Decision(decision="deny", code=self.deny[op.kind], http_status=403,
                            reason="blocked by test rule", profile_hash=profile.profile_hash)
        return Decision(decision="allow", profile_hash=profile.profile_hash)


class ScriptedExecutor:
    """A real executor whose behaviour each test sets: return, raise, sleep, consume."""

    def __init__(self, name: str = "fake", *, kinds: frozenset[OpKind] | None = None,
                 caps: dict[str, Any] | None = None, local: bool = False) -> None:
        self.name = name
        self.capabilities = ExecutorCapabilities(
            op_kinds=kinds or frozenset(OpKind), **(caps or {}))
        self.local = local
        self.calls = 0
        self.raise_exc: BaseException | None = None
        self.sleep_s = 0.0
        self.honour_cancel = True
        self.consume: list[tuple[str, int]] = []
        self.used = Usage()
        self.out: dict[str, Any] = {"digest": "d"}
        self._lock = threading.Lock()

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        with self._lock:
            self.calls += 1
        for kind, amount in self.consume:
            ctx.consume(kind, amount)
        if self.sleep_s:
            if self.honour_cancel:
                ctx.cancel.wait(self.sleep_s)
            else:
                time.sleep(self.sleep_s)
        if self.raise_exc is not None:
            raise self.raise_exc
        return ExecResult(ok=True, out=dict(self.out), used=self.used)

    def close(self) -> None:
        """Nothing to release."""


class ExecutorPlugin:
    """A plugin object (not a module) providing the given executors through the hook."""

    def __init__(self, *executors: ScriptedExecutor) -> None:
        self.executors = executors

    @hookimpl
    def policy_engine_executors(self, config: EngineConfig) -> list[ScriptedExecutor]:
        return list(self.executors)


def config(tmp: Path, **kw: Any) -> EngineConfig:
    kw.setdefault("budget_meter", "memory")
    kw.setdefault("revocation", "memory")
    return EngineConfig(state_dir=tmp, **kw)


def orchestrator(tmp: Path, *executors: ScriptedExecutor, prof: Profile | None = None,
                 guard: ScriptedGuard | None = None, extra_plugins: tuple[object, ...] = (),
                 **cfg: Any) -> Orchestrator:
    # only the sink and meter plugins: executors installed through entry points (fs, tmp, proc…)
    # would otherwise serve the op kinds these tests route to their scripted executors
    pm = PluginManager()
    for module in (evidence_jsonl, evidence_sqlite, budget_memory, budget_sqlite):
        pm.register(module, module.__name__.rsplit(".", 1)[-1])
    pm.register(ExecutorPlugin(*executors), "test-executors")
    for i, plugin in enumerate(extra_plugins):
        pm.register(plugin, f"test-extra-{i}")
    if "backends" not in cfg:
        # name the scripted executors as the backends, as a deployment names a non-default one:
        # a missing first-party default is refused, never replaced (selection.select)
        chosen: dict[OpKind, str] = {}
        for ex in executors:
            if getattr(ex, "local", False) is not True:
                for kind in ex.capabilities.op_kinds:
                    chosen.setdefault(kind, ex.name)
        cfg["backends"] = chosen
    return Orchestrator(POLICYSET, config=config(tmp, **cfg), plugins=pm, clock=lambda: NOW,
                        profile_builder=FixedBuilder(prof or profile()),
                        guard=guard or ScriptedGuard(), revocations=MemoryRevocationList())
