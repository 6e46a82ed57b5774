"""Deciding one witness under one policy version with the real engine: ProfileBuilder, then Guard.

A witness gets a grant and a manifest naming exactly its resource (or the caller's grant and
manifest, for ``analyze`` over a given set), so only the policy decides it; this is the path
``replay`` and the orchestrator take before anything runs, and nothing is executed.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_engine.errors import PolicyEngineError
from policy_engine.graph.policyset import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import (
    Capability,
    Consent,
    Decision,
    ExecOp,
    Grant,
    Manifest,
    NetworkMode,
    SafetyClass,
    SideEffect,
)
from policy_engine.profile import ProfileBuilder

NOW = 1_800_000_000_000
FAR = 4_000_000_000_000


@dataclass(frozen=True, slots=True)
class Setting:
    """What else a witness is decided with: the consent the grant carries, the manifest's class."""

    consent: bool = True
    safety: SafetyClass = SafetyClass.LOW
    side_effects: tuple[SideEffect, ...] = (SideEffect.NONE,)
    network: NetworkMode | None = None  # what the manifest asks for (net.http, browser.use)

    def label(self) -> str:
        effects = ",".join(str(s) for s in self.side_effects)
        text = (f"consent {'given' if self.consent else 'absent'}, safety {self.safety}, "
                f"side effects {effects}")
        return text + (f", manifest network {self.network}" if self.network else "")


DEFAULT = Setting()


@dataclass(frozen=True, slots=True)
class Verdict:
    """One side: decision, code (for a deny), deciding rule as ``id@file:line:col``, rule id."""

    decision: str
    code: str | None
    rule: str | None
    rule_id: str | None

    @property
    def key(self) -> tuple[str, str | None]:
        return self.decision, self.code

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision, "code": self.code, "rule": self.rule}


def grant_for(cap: Capability, setting: Setting = DEFAULT) -> Grant:
    consent = Consent(granted_by="diff", granted_at=0, expires_at=FAR) if setting.consent else None
    return Grant(tenant="diff", subject_id="agent:diff", tool_name="diff", call_id="diff",
                 capabilities=(cap,), expires_at=FAR, consent=consent)


def manifest_for(cap: Capability, setting: Setting = DEFAULT) -> Manifest:
    return Manifest(name="diff", version="1", permissions=(cap,), safety_class=setting.safety,
                    side_effects=setting.side_effects, network=setting.network)


class Decider:
    """One policy version's real engine: its ProfileBuilder and a Guard without disk facts.

    The policy alone decides a witness: symlinks and what lies on this machine's disk are the
    run's business (the guard checks them again at run time), not the policy's meaning.
    """

    def __init__(self, ps: PolicySet) -> None:
        self.ps = ps
        self.builder = ProfileBuilder(ps)
        self.guard = Guard(ps, resolve_symlinks=False, fs_facts=False)

    def __call__(self, op: ExecOp, grant: Grant, manifest: Manifest) -> Decision:
        """The engine's decision on ``op``: a profile the meet refuses is a deny with its code."""
        try:
            profile = self.builder.build(grant, manifest)
        except PolicyEngineError as exc:
            return Decision(decision="deny", code=exc.code.value, reason=exc.reason)
        return self.guard.decide(profile, op, now_ms=NOW)


def decide(ps: PolicySet, op: ExecOp, grant: Grant, manifest: Manifest) -> Decision:
    return Decider(ps)(op, grant, manifest)


def verdict(d: Decision) -> Verdict:
    rule = (f"{d.rule.id}@{Path(d.rule.file).name}:{d.rule.line}:{d.rule.column}"
            if d.rule else None)
    return Verdict(d.decision, None if d.allowed else d.code, rule, d.rule.id if d.rule else None)


def op_json(op: ExecOp) -> dict[str, Any]:
    """The op as request JSON: its kind and every field not left at its default."""
    return {"kind": op.kind, **op.model_dump(mode="json", exclude_defaults=True)}


def describe(op: ExecOp) -> str:
    """A one-line form of an op for reports (JSON carries the op itself)."""
    data = op.model_dump(mode="json", exclude_defaults=True)
    data.pop("kind", None)
    kind = op.kind
    for key in ("path", "url", "tool"):
        if key in data:
            head = f"{kind} {data.pop(key)}"
            break
    else:
        head = kind
    if "method" in data:
        head = f"{kind} {data.pop('method')} {head.split(' ', 1)[1]}"
    if "args" in data:
        head += " " + json.dumps(data.pop("args"), ensure_ascii=False)
    if "bytes_b64" in data:  # the size is what a policy reads, not the (zero) content
        data["size"] = len(base64.b64decode(data.pop("bytes_b64")))
    rest = ", ".join(f"{k}={v}" for k, v in data.items())
    return head + (f" ({rest})" if rest else "")
