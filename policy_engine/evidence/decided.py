"""The decision fields of an end record: deciding rule, policy version, public reason, limits."""

from __future__ import annotations

from typing import Any

from policy_engine.evidence.redact import redact_text
from policy_engine.model import Decision, Limits, Profile


def decision_fields(decision: Decision, profile: Profile | None,
                    policy_version_hash: str) -> dict[str, Any]:
    """What ``EvidenceEnd`` records about the decision a call ran under.

    The reason is the guard's public reason with any URL in it redacted (reasons name an
    argument by position and size, never by value). The limits are the effective ones: those the
    decision carries when the guard reports them, else the profile's (the meet of grant,
    manifest, policy and settings), which is what the executor was held to.
    """
    # the guard may report its own effective limits (the field is being added to Decision)
    # read from the fields (``__dict__``), not ``getattr``: a name the model lacks costs
    # pydantic's ``__getattr__`` and an AttributeError on every call (docs/benchmarks.md,
    # "Twelfth pass")
    fields = getattr(decision, "__dict__", {})
    limits = fields.get("effective_limits")  # the first of these two that is a Limits
    if not isinstance(limits, Limits):
        limits = fields.get("limits")
        if not isinstance(limits, Limits):
            limits = profile.limits if profile else None
    return {
        "decision": decision.decision,
        "rule": decision.rule,
        "policy_version_hash": profile.policy_version_hash if profile else policy_version_hash,
        "reason": redact_text(decision.reason) if decision.reason else None,
        "limits": limits,
        "timeout_ms": profile.timeout_ms if profile else None,
    }
