"""Decision tracing, kept apart from evaluation (OPA ``topdown/trace.go``).

The guard holds ``tracer: Tracer | None``; on the fast path it is ``None`` and no trace object is
ever built. Renderers (text, JSON) live in ``policy_engine.explain``.
"""

from __future__ import annotations

from typing import Literal

from policy_engine.model import RuleRef, TraceStep

Outcome = Literal["match", "no-match", "condition-false", "condition-error", "allow", "deny",
                  "skip", "pass", "fail"]

NODES: tuple[str, ...] = (
    "kind", "expiry", "resolve", "forbid", "network", "permit", "grant", "manifest",
    "default-deny", "env", "address", "limits", "consent", "layer:network", "layer:policy",
    "layer:manifest", "layer:grant", "layer:limits", "layer:consent", "decision",
)
"""Node names in the order the guard visits them (see ``policy_engine.guard.guard``); the
``layer:*`` steps are added to a traced deny only (``policy_engine.guard.layers``)."""


class Tracer:
    """Collects :class:`TraceStep` events in visiting order."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps: list[TraceStep] = []

    def step(self, node: str, outcome: Outcome, rule: RuleRef | None = None,
             detail: str = "") -> None:
        self.steps.append(TraceStep(node=node, outcome=outcome, rule=rule, detail=detail))

    def freeze(self) -> tuple[TraceStep, ...]:
        return tuple(self.steps)
