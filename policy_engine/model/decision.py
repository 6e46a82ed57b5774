"""A guard decision and the optional trace of the decision nodes it visited."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from policy_engine.model.limits import Limits
from policy_engine.model.profile import RuleRef
from policy_engine.model.readonly import LayerMap


class TraceStep(BaseModel):
    """One visited node of the decision graph: which rule, what happened and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    outcome: Literal["match", "no-match", "condition-false", "condition-error", "allow", "deny",
                     "skip", "pass", "fail"]
    rule: RuleRef | None = None
    detail: str = ""


class Decision(BaseModel):
    """The answer for one operation under one profile (DESIGN.md §3)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Literal["allow", "deny"]
    code: str | None = None
    http_status: int = 200
    reason: str = ""
    rule: RuleRef | None = None
    profile_hash: str = ""
    trace: tuple[TraceStep, ...] | None = None
    limits: Limits | None = None
    """On an allow: the call's effective limits (profile ⊓ permitting rule ⊓ op-declared values),
    every field set; what the orchestrator hands the executor (``ExecContext.limits``)."""
    limit_layers: LayerMap | None = None
    """On an allow: per limit field, the layer that set it (``LIMIT_LAYERS``; read-only)."""

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"
