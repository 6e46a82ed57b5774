"""Hand-built profiles, rules and conditions for the guard tests (no compiler needed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policy_engine.errors import Span
from policy_engine.graph import CompiledRule, ConsentRule, PolicySet
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    AllowLists,
    Budget,
    CapabilityKind,
    Consent,
    DenyLists,
    FsCapability,
    Limits,
    Mappings,
    NetworkMode,
    Profile,
    ProfileCapability,
    ProfileDeny,
    RuleRef,
    SafetyClass,
    SideEffect,
)

NOW = 1_700_000_000_000
LATER = NOW + 3_600_000


def ref(rule_id: str, line: int = 1) -> RuleRef:
    return RuleRef(id=rule_id, file="policy.sbpolicy", line=line, column=1)


@dataclass
class PyCondition:
    """A CompiledCondition stand-in: a Python predicate over the CEL context."""

    source: str
    fn: Callable[[Mapping[str, Any]], bool]
    span: Span = Span("policy.sbpolicy", 1, 1)
    calls: int = 0

    def evaluate(self, context: Mapping[str, object]) -> tuple[bool, str | None]:
        self.calls += 1
        try:
            return bool(self.fn(context)), None
        except Exception as exc:  # noqa: BLE001 — mirrors the CEL adapter: errors are values
            return False, f"{type(exc).__name__}: {exc}"


def permit(kind: str, *caps: Any, rule: str = "permit-1", condition: str | None = None,
           limits: Limits | None = None) -> ProfileCapability:
    return ProfileCapability(kind=CapabilityKind(kind), all_of=caps, rule=ref(rule),
                             condition=condition, limits=limits)


def forbid(kinds: tuple[str, ...], cap: Any, *, rule: str = "forbid-1",
           condition: str | None = None, mandatory: bool = False) -> ProfileDeny:
    return ProfileDeny(kinds=tuple(CapabilityKind(k) for k in kinds), capability=cap,
                       rule=ref(rule), condition=condition, mandatory=mandatory)


def fs(kind: str, *paths: str) -> FsCapability:
    return FsCapability(kind=kind, paths=paths)


def make_profile(
    *,
    capabilities: tuple[ProfileCapability, ...] = (),
    denies: tuple[ProfileDeny, ...] = (),
    granted: tuple[Any, ...] | None = None,
    declared: tuple[Any, ...] | None = None,
    root_fs: str = "/workspace",
    tmp_dir: str = "/tmp/policy-engine",
    home: str = "/home/agent",
    network: NetworkMode = NetworkMode.ON,
    limits: Limits = SYSTEM_DEFAULT_LIMITS,
    consent_required: bool = False,
    consent: Consent | None = None,
    safety: SafetyClass = SafetyClass.LOW,
    side_effects: tuple[SideEffect, ...] = (SideEffect.READ,),
    expires_at: int = LATER,
    deny: DenyLists | None = None,
    profile_hash: str = "",
    timeout_ms: int = 60_000,
) -> Profile:
    """A profile whose grant and manifest admit everything its capabilities do, by default."""
    members = tuple(m for c in capabilities for m in c.all_of)
    return Profile(
        tenant="acme", subject_id="agent:1", tool_name="tool", call_id="call-1",
        capabilities=capabilities, denies=denies,
        granted=members if granted is None else granted,
        declared=members if declared is None else declared,
        safety=safety, side_effects=side_effects, limits=limits, budget=Budget(),
        allow=AllowLists(), deny=deny or DenyLists(),
        mappings=Mappings(root_fs=root_fs, tmp_dir=tmp_dir, home=home),
        network=network, timeout_ms=timeout_ms, consent_required=consent_required,
        consent=consent, expires_at=expires_at, policy_name="acme/agents",
        policy_version="1.0.0", policy_version_hash="0" * 64, manifest_version="1.0.0",
        profile_hash=profile_hash,
    )


def make_policyset(
    *conditions: tuple[str, PyCondition], consent_rules: tuple[ConsentRule, ...] = ()
) -> PolicySet:
    """A policy set holding only what the guard reads: rule conditions and consent rules."""
    span = Span("policy.sbpolicy", 1, 1)
    rules = tuple(
        CompiledRule(id=rid, effect="permit",
                     capabilities={CapabilityKind.FS_READ: fs("fs.read", "/**")},
                     ref=ref(rid), span=span, condition=cond)
        for rid, cond in conditions
    )
    return PolicySet(
        name="acme/agents", version="1.0.0", version_hash="0" * 64, files=("policy.sbpolicy",),
        defaults=Limits(), network=NetworkMode.ON, rules=rules, permits_by_kind={},
        forbids_by_kind={}, consent_rules=consent_rules, profiles={}, tools={},
        home="/home/agent",
    )


def consent_rule(cond: PyCondition | None) -> ConsentRule:
    return ConsentRule(ref=ref("consent-1"), span=Span("policy.sbpolicy", 1, 1), condition=cond)


def valid_consent() -> Consent:
    return Consent(granted_by="alice", granted_at=NOW - 1000, expires_at=NOW + 60_000)
