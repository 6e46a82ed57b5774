"""The explain pipeline: build the profile, decide with a tracer, keep everything for rendering."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from policy_engine.errors import ErrorCode, PolicyEngineError, spec_of
from policy_engine.explain.request import ExplainRequest
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import (
    LIMIT_FIELDS,
    Decision,
    Grant,
    Manifest,
    Profile,
    TraceStep,
    Usage,
)
from policy_engine.profile import ProfileBuilder

if TYPE_CHECKING:
    from policy_engine.config import EngineConfig
    from policy_engine.executor import Executor


@dataclass(frozen=True, slots=True)
class Explanation:
    """Everything `explain` shows: the decision, the profile it was made on, and the inputs."""

    decision: Decision
    profile: Profile | None
    policyset: PolicySet
    manifest: Manifest
    grant: Grant
    request: ExplainRequest

    def to_json(self) -> dict[str, Any]:
        # imported here: the digest helpers load the evidence records, which text output (the
        # default) never needs
        from policy_engine.evidence import redacted_op

        d = self.decision
        return {
            "decision": d.decision,
            "code": d.code,
            "http_status": d.http_status,
            "reason": d.reason,
            "rule": d.rule.model_dump(mode="json") if d.rule else None,
            "profile": self.profile.model_dump(mode="json") if self.profile else None,
            # what the backend must provide whatever the mode (`isolation gvisor`)
            "backend_requires": self.backend_requires(),
            "trace": [step.model_dump(mode="json") for step in d.trace or ()],
            "refused_by": [s.node.removeprefix("layer:") for s in d.trace or ()
                           if s.node.startswith("layer:") and s.outcome == "fail"],
            "limits": {field: {"value": value, "layer": layer}
                       for field, (value, layer) in self.limits().items()},
            # the redacted view evidence uses: explain output is logged and pasted around too
            "op": redacted_op(self.request.op),
            "policy": {
                "name": self.policyset.name,
                "version": self.policyset.version,
                "version_hash": self.policyset.version_hash,
            },
            "tool": {"name": self.manifest.name, "version": self.manifest.version},
        }


    def backend_requires(self) -> list[str]:
        from policy_engine.explain.backend import requirements_shown
        from policy_engine.model import OpKind

        if self.profile is None:
            return []
        return requirements_shown(self.profile, OpKind(self.request.op.kind))

    def limits(self) -> dict[str, tuple[int | float | None, str]]:
        """Each effective limit and the layer that set it: the decision's (the permitting rule
        and the op included) on an allow, else the profile's; empty without a profile."""
        d = self.decision
        if d.limits is not None:
            values, layers = d.limits, d.limit_layers or {}
        elif self.profile is not None:
            values, layers = self.profile.limits, self.profile.limit_layers
        else:
            return {}
        return {f: (getattr(values, f), layers.get(f, "profile")) for f in LIMIT_FIELDS}


def explain(
    policyset: PolicySet, manifest: Manifest, grant: Grant, request: ExplainRequest,
    *, builder: ProfileBuilder | None = None, guard: Guard | None = None,
    executors: Mapping[str, Executor] | None = None, config: EngineConfig | None = None,
    trace: bool = True,
) -> Explanation:
    """Decide ``request.op`` exactly as the orchestrator would, with the trace attached.

    With ``executors`` and ``config`` (the engine's, as ``explain --config`` loads them) an
    allowed op also goes through the backend selection the run makes: a backend that cannot
    provide what the profile requires (``isolation gvisor``), or that refuses the op itself (a
    restricted network on proc-landlock, a docker cwd outside /workspace/work), is the run's
    refusal here too.

    A profile that cannot be built (a widening override, a grant for another tool) is itself a
    decision: a deny carrying the builder's code, with a one-step trace saying so.

    ``trace=False`` decides as the run does, without the tracer (the service's compact answer,
    which shows no trace): the same decision, code, reason, rule and limits.
    """
    builder = builder or ProfileBuilder(policyset)
    guard = guard or Guard(policyset)
    now_ms = request.now_ms if request.now_ms is not None else int(time.time() * 1000)
    try:
        profile = builder.build(
            grant, manifest, settings=request.settings, overrides=request.overrides
        )
    except PolicyEngineError as exc:
        spec = spec_of(exc.code)
        decision = Decision(
            decision="deny", code=exc.code.value, http_status=spec.http_status,
            reason=exc.reason,
            trace=(TraceStep(node="profile", outcome="deny", detail=exc.reason),),
        )
        return Explanation(decision, None, policyset, manifest, grant, request)
    # the call's own context, as the run hands it to the guard (``Orchestrator.run``): the
    # guard's per-profile ``grant``/``manifest``/``tenant``/``subject`` views (built once per
    # compiled profile) unless the caller's context gives one. A context of its own (the grant
    # and manifest as sent) decided some conditions otherwise than the run (side effects in
    # the caller's order and with repeats; its grant over the caller's), and cost ≈ 7 µs
    context = request.context or None
    with_view = executors is not None and config is not None
    if request.facts is not None and not with_view:
        # no executor to ask: the request's own facts, never this machine's disk
        from policy_engine.guard.facts import parse_declared

        guard = guard.with_facts(parse_declared(request.facts))
    decision = guard.decide(profile, request.op, context=context, now_ms=now_ms, trace=trace)
    if trace and decision.trace is not None:
        from policy_engine.explain.variables import variable_steps

        steps = variable_steps(policyset, request.settings)
        if steps:  # what the profile's `$SESSION` paths were, before the guard's steps
            decision = decision.model_copy(update={"trace": (*steps, *decision.trace)})
    if decision.allowed and request.budget_used is not None:
        decision = _dry_run_budget(decision, profile, request.budget_used)
    if decision.allowed and executors is not None and config is not None:
        from policy_engine.explain.backend import backend_step

        decision = backend_step(decision, profile, request.op, executors, config,
                                trace=trace)
    if request.facts is not None and with_view:
        from policy_engine.explain.backend import declared_facts_step

        decision = declared_facts_step(decision, profile, request.op, request.facts)
    return Explanation(decision, profile, policyset, manifest, grant, request)


def _dry_run_budget(decision: Decision, profile: Profile, used: Usage) -> Decision:
    """What the orchestrator's check-and-consume of one call would answer, consuming nothing."""
    limit = profile.budget.calls
    trace = decision.trace or ()
    if limit is not None and used.calls + 1 > limit:
        reason = f"budget `calls` exhausted: {used.calls} of {limit} used"
        spec = spec_of(ErrorCode.BUDGET_EXCEEDED)
        return decision.model_copy(update={
            "decision": "deny", "code": spec.code.value, "http_status": spec.http_status,
            "reason": reason, "rule": None,
            "trace": (*trace, TraceStep(node="budget", outcome="fail", detail=reason)),
        })
    detail = f"calls {used.calls + 1} of {limit if limit is not None else 'unlimited'}"
    return decision.model_copy(
        update={"trace": (*trace, TraceStep(node="budget", outcome="pass", detail=detail))})
