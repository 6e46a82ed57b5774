"""Explain's "why not": on a deny, every layer that would refuse the op, not only the first.

Run only when a trace is asked for (``explain``), after the decision: the op is resolved again
and judged by each layer on its own — the network mode, the policy (its forbids and its permits
alone, before the meet), the tool manifest, the grant, the limits and consent. Each becomes a
``layer:<name>`` trace step, ``fail`` with the reason or ``pass``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policy_engine.graph import PolicySet
from policy_engine.guard.compiled import (
    CompiledProfile,
    GuardCondition,
    _limits,
    effective_limits,
    guard_condition,
)
from policy_engine.guard.env import env_allow
from policy_engine.guard.matchers import Matcher, compile_matcher
from policy_engine.guard.resolve import Resolved, build_context
from policy_engine.guard.steps import consent_needed, limit_violation
from policy_engine.model import Limits, ProcCapability, RuleRef, TraceStep

_NET_OPS = frozenset({"net.http", "browser.nav", "browser.screenshot"})


@dataclass(frozen=True, slots=True)
class PolicyPermit:
    """One permit rule of the policy for one capability kind, compiled on its own."""

    rule: RuleRef
    matcher: Matcher
    env: Any  # EnvAllow for proc.exec, else None
    condition: GuardCondition | None
    limits: Limits | None


class PolicyPermits:
    """The policy's permits per (capability kind, home), compiled on first use."""

    def __init__(self, policyset: PolicySet | None) -> None:
        self.policyset = policyset
        self._cache: dict[tuple[str, str], tuple[PolicyPermit, ...]] = {}

    def of(self, cap_kind: str, home: str) -> tuple[PolicyPermit, ...] | None:
        if self.policyset is None:
            return None
        key = (cap_kind, home)
        found = self._cache.get(key)
        if found is None:
            out: list[PolicyPermit] = []
            for rule in self.policyset.rules:
                if rule.effect != "permit":
                    continue
                for kind, cap in rule.capabilities.items():
                    if str(kind) != cap_kind:
                        continue
                    env = env_allow(cap.env, True, (), f"rule `{rule.ref.id}`") \
                        if isinstance(cap, ProcCapability) else None
                    cond = guard_condition(rule.condition) if rule.condition else None
                    out.append(PolicyPermit(rule.ref, compile_matcher(cap, cap_kind, home),
                                            env, cond, rule.limits))
            found = self._cache[key] = tuple(out)
        return found


def layer_steps(
    permits: PolicyPermits, cp: CompiledProfile, kind: str, cap_kind: str, op: Any,
    res: object, rv: Resolved | None, path: str | None, written: str | None, now: int,
    extra: Mapping[str, object] | None,
    consent: Callable[[Callable[[], Mapping[str, object]]], str | None],
) -> list[TraceStep]:
    """One ``layer:*`` step per layer; ``consent`` answers :func:`consent_needed` for a context.
    ``written``: the path as the op spelt it when resolving its links changed it (forbids see
    both, as the guard's own step 3 does)."""
    box: list[dict[str, object]] = []

    def ctx() -> dict[str, object]:
        if not box:
            box.append(build_context(cp, op, kind, path, rv, now, extra))
        return box[0]

    env = op.env if kind == "proc.exec" and op.env else None
    out: list[TraceStep] = []

    def step(layer: str, why: str | None, ok: str = "", rule: RuleRef | None = None) -> None:
        out.append(TraceStep(node=f"layer:{layer}", outcome="fail" if why else "pass",
                             rule=rule, detail=why or ok))

    if kind in _NET_OPS:
        step("network", "network is off for this profile" if cp.network_off else None,
             f"network {cp.profile.network}")
    if permits.policyset is None:
        out.append(TraceStep(node="layer:policy", outcome="skip",
                             detail="no policy set: the profile's capabilities stand for it"))
    else:
        why, rule = _policy(permits, cp, cap_kind, res, written, env, ctx)
        step("policy", why, "a permit admits it", rule)
    step("manifest", None if _admits(cp.declared.get(cap_kind, ()), res)
         else "no permission the tool manifest declares admits it")
    step("grant", None if _admits(cp.granted.get(cap_kind, ()), res)
         else "no capability of the grant admits it")
    # the limits of the capability that admits the op; when none does (another layer refused),
    # those of the policy permit that admits it, met with the profile's
    cap = next((c for c in cp.caps.get(cap_kind, ()) if c.test(res)), None)
    found = permits.of(cap_kind, cp.profile.mappings.home) or ()
    permit = next((p for p in found if p.matcher.admits(res)), None)
    if cap is not None:
        over = limit_violation(kind, op, cap.limits, rv, path)
        step("limits", over[1] if over else None, "within the limits", cap.rule)
    elif permit is not None:
        lim, _layers = effective_limits(permit.limits, None, cp.profile)
        over = limit_violation(kind, op, _limits(lim, None), rv, path)
        step("limits", over[1] if over else None, "within the limits", permit.rule)
    why_consent = consent(ctx)
    step("consent", why_consent, "no consent missing")
    return out


def _admits(matchers: tuple[Matcher, ...], res: object) -> bool:
    return any(m.admits(res) for m in matchers)


def _policy(permits: PolicyPermits, cp: CompiledProfile, cap_kind: str, res: object,
            written: str | None, env: Mapping[str, str] | None,
            ctx: Callable[[], Mapping[str, object]]) -> tuple[str | None, RuleRef | None]:
    fset = cp.forbids.get(cap_kind)
    for d in fset.denies if fset is not None else ():
        if d.admits(res, written):
            val, err = d.condition.run(ctx()) if d.condition is not None else (True, None)
            if val or err is not None:
                what = f"forbid rule `{d.label}`" if d.rule else "the deny-list"
                return f"{what} blocks it", d.rule
    found = permits.of(cap_kind, cp.profile.mappings.home) or ()
    first: str | None = None
    for p in found:
        if not p.matcher.admits(res):
            first = first or f"rule `{p.rule.id}`: {p.matcher.why_not(res)}"
            continue
        if env is not None and p.env is not None:
            why_env = p.env.refusal(env)
            if why_env is not None:
                first = first or why_env
                continue
        if p.condition is not None:
            val, err = p.condition.run(ctx())
            if err is not None or not val:
                first = first or f"the condition of rule `{p.rule.id}` is " + (
                    "in error" if err else "false")
                continue
        return None, p.rule
    return f"no permit of the policy admits it ({first or 'none for this kind'})", None


def consent_for(guard_rules: tuple[GuardCondition, ...], refs: tuple[RuleRef | None, ...],
                builtin: RuleRef | None, cp: CompiledProfile,
                now: int) -> Callable[[Callable[[], Mapping[str, object]]], str | None]:
    """:func:`consent_needed` bound to a guard's consent rules, without tracing."""
    def run(ctx: Callable[[], Mapping[str, object]]) -> str | None:
        if not (cp.consent_required or guard_rules):
            return None
        return consent_needed(cp, guard_rules, ctx, now, None, refs, builtin,
                              window=cp.consent_window)
    return run
