"""Stages ComputeVersionHash, ExpandHome and BuildRuleIndices: from drafts to the PolicySet."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from policy_engine.compiler.builtins import BUILTIN_SPAN, CONSENT_ID, builtin_ref
from policy_engine.compiler.context import CompileContext, RuleDraft
from policy_engine.graph import CompiledRule, ConsentRule, NamedProfile, PolicySet
from policy_engine.model import Capability, CapabilityKind, FsCapability, Manifest, RuleRef
from policy_engine.patterns import expand_home

HASH_FORMAT = 1
"""Bumped when the canonical form below changes meaning (so old hashes never collide)."""


def compute_version_hash(ctx: CompileContext) -> None:
    """SHA-256 over the canonical JSON of the compiled policy, before ``~`` is expanded.

    The form names files by their path relative to the first root file's directory and
    includes each file's content digest, so the hash is the same on every machine and run
    and changes whenever any source changes.
    """
    rules = [_rule_doc(d) for d in ctx.builtin_rules + ctx.rules]
    consents: list[Any] = [
        {"id": c.id, "file": c.unit.rel, "line": c.node.span.line,
         "condition": c.condition.source if c.condition else None}
        for c in ctx.consents
    ] or [{"id": CONSENT_ID, "builtin": True}]
    doc = {
        "format": HASH_FORMAT,
        "name": ctx.name,
        "version": ctx.version,
        "defaults": ctx.defaults.model_dump(mode="json", exclude_none=True),
        "network": ctx.network.value,
        "rules": rules,
        "consent": consents,
        "profiles": {n: _profile_doc(p) for n, p in sorted(ctx.profiles.items())},
        "tools": {n: m.model_dump(mode="json", by_alias=True)
                  for n, m in sorted(ctx.tools.items())},
        "files": [{"path": u.rel, "sha256": hashlib.sha256(u.file.source.encode()).hexdigest()}
                  for u in ctx.units],
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    ctx.version_hash = hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _rule_doc(d: RuleDraft) -> dict[str, Any]:
    return {
        "id": d.id,
        "effect": d.node.effect,
        "mandatory": d.node.mandatory,
        "file": d.unit.rel,
        "line": d.node.span.line,
        "column": d.node.span.column,
        "capabilities": {k.value: c.model_dump(mode="json", by_alias=True)
                         for k, c in d.capabilities.items()},
        "limits": d.limits.model_dump(mode="json", exclude_none=True) if d.limits else None,
        "condition": d.condition.source if d.condition else None,
    }


def _profile_doc(p: NamedProfile) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "network": p.network.value if p.network else None,
        "fs_mode": p.fs_mode,
        "writable": list(p.writable) if p.writable is not None else None,
        "limits": p.limits.model_dump(mode="json", exclude_none=True),
    }
    if p.isolation is not None:  # only when set: policies without it keep their version hash
        doc["isolation"] = p.isolation.value
    return doc


def expand_home_stage(ctx: CompileContext) -> None:
    """Replace a leading ``~`` (and ``**/``) in every path glob by its absolute form.

    Runs after ComputeVersionHash so the hash does not depend on the compiling user's home.
    """
    for draft in ctx.builtin_rules + ctx.rules:
        draft.capabilities = {k: _expand_cap(c, ctx.home) for k, c in draft.capabilities.items()}
    for name, prof in list(ctx.profiles.items()):
        if prof.writable is not None:
            ctx.profiles[name] = NamedProfile(
                name=prof.name, span=prof.span, network=prof.network, fs_mode=prof.fs_mode,
                writable=tuple(expand_home(p, ctx.home) for p in prof.writable),
                limits=prof.limits, isolation=prof.isolation,
            )
    for name, manifest in list(ctx.tools.items()):
        ctx.tools[name] = manifest.model_copy(update={
            "permissions": tuple(_expand_cap(c, ctx.home) for c in manifest.permissions)})


def _expand_cap(cap: Capability, home: str) -> Capability:
    if isinstance(cap, FsCapability):
        return cap.model_copy(update={"paths": tuple(expand_home(p, home) for p in cap.paths)})
    return cap


def build_rule_indices(ctx: CompileContext) -> None:
    """Assemble the PolicySet: rules in order, indexed by kind, mandatory forbids first."""
    compiled = [_compiled(d) for d in ctx.builtin_rules + ctx.rules]
    permits: dict[CapabilityKind, list[CompiledRule]] = {k: [] for k in CapabilityKind}
    forbids: dict[CapabilityKind, list[CompiledRule]] = {k: [] for k in CapabilityKind}
    for rule in compiled:
        for kind in rule.kinds:
            (permits if rule.effect == "permit" else forbids)[kind].append(rule)
    for kind, rules in forbids.items():  # stable: source order within each group
        forbids[kind] = sorted(rules, key=lambda r: not r.mandatory)
    consents = tuple(
        ConsentRule(ref=RuleRef(id=c.id, file=c.node.span.file, line=c.node.span.line,
                                column=c.node.span.column),
                    span=c.node.span, condition=c.condition)
        for c in ctx.consents
    ) or (ConsentRule(ref=builtin_ref(CONSENT_ID), span=BUILTIN_SPAN, condition=None),)
    ctx.result = PolicySet(
        name=ctx.name,
        version=ctx.version,
        version_hash=ctx.version_hash,
        files=tuple(u.file.file for u in ctx.units),
        defaults=ctx.defaults,
        network=ctx.network,
        rules=tuple(compiled),
        permits_by_kind={k: tuple(v) for k, v in permits.items()},
        forbids_by_kind={k: tuple(v) for k, v in forbids.items()},
        consent_rules=consents,
        profiles=dict(ctx.profiles),
        tools=dict[str, Manifest](ctx.tools),
        home=ctx.home,
    )


def _compiled(d: RuleDraft) -> CompiledRule:
    span = d.node.span
    return CompiledRule(
        id=d.id,
        effect=d.node.effect,
        capabilities=dict(d.capabilities),
        ref=RuleRef(id=d.id, file=span.file, line=span.line, column=span.column),
        span=span,
        limits=d.limits,
        condition=d.condition,
        mandatory=d.node.mandatory,
    )
