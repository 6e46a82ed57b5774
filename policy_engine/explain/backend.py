"""The backend step of a dry run: what the profile requires of its backend, and whether the
configured one provides it and takes the op (the orchestrator's own selection, nothing run)."""

from __future__ import annotations

from collections.abc import Mapping

from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.model import Decision, ExecOp, OpKind, Profile, TraceStep
from policy_engine.orchestration.selection import (
    NEVER_DEGRADED,
    refusal_decision,
    required_capabilities,
    select,
)


def requirements_shown(profile: Profile, op_kind: OpKind) -> list[str]:
    """The requirements a backend can never be excused from, as explain lists them."""
    return [f"{r.capability} ({r.why}; never degraded)"
            for r in required_capabilities(profile, op_kind)
            if r.capability in NEVER_DEGRADED and r.capability != "mandatory_denies"]


def backend_step(decision: Decision, profile: Profile, op: ExecOp,
                 executors: Mapping[str, Executor], config: EngineConfig) -> Decision:
    """``decision`` (an allow) with a ``backend`` trace step; a deny carrying the selection's
    code when the run would refuse the backend (``SANDBOX.CAPABILITY_BLOCKED`` for a missing
    capability or an op the executor refuses, ``PROVIDER.UNAVAILABLE`` for a backend that is
    not loaded)."""
    sel = select(executors, config, profile, OpKind(op.kind), op)
    trace = decision.trace or ()
    if sel.error is not None:
        step = TraceStep(node="backend", outcome="fail", detail=sel.error.reason)
        return refusal_decision(decision, sel.error).model_copy(
            update={"trace": (*trace, step)})
    detail = f"backend `{sel.backend}`"
    if profile.isolation is not None:
        detail += f" provides isolation `{profile.isolation.value}`"
    if sel.degraded:
        detail += "; degraded: " + "; ".join(sel.degraded)
    step = TraceStep(node="backend", outcome="pass", detail=detail)
    return decision.model_copy(update={"trace": (*trace, step)})
