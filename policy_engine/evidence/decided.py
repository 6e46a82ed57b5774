"""The decision fields of an end record: deciding rule, policy version, public reason, limits."""

from __future__ import annotations

from typing import Any

from policy_engine.evidence.redact import redact_text
from policy_engine.model import Decision, Limits, Profile

# (id(decision), id(profile), hash) -> (decision, profile, fields): the guard answers a cached
# decision with the same frozen object and the profile cache hands out the same profile, so a
# grant's calls record the same fields; the entry holds both, so their ids are not reused
_KEPT: dict[tuple[int, int, str], tuple[Decision, Profile | None, dict[str, Any]]] = {}
_KEPT_MAX = 1024


def decision_fields(decision: Decision, profile: Profile | None,
                    policy_version_hash: str) -> dict[str, Any]:
    """``fields_of`` remembered per decision and profile object (the dict is shared: the
    caller only reads it)."""
    key = (id(decision), id(profile), policy_version_hash)
    hit = _KEPT.get(key)
    if hit is not None and hit[0] is decision and hit[1] is profile:
        return hit[2]
    fields = fields_of(decision, profile, policy_version_hash)
    if len(_KEPT) >= _KEPT_MAX:
        _KEPT.clear()  # a cache, not a limit
    _KEPT[key] = (decision, profile, fields)
    return fields


def fields_of(decision: Decision, profile: Profile | None,
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
    carried = next((v for v in (fields.get(n) for n in ("effective_limits", "limits"))
                    if isinstance(v, Limits)), None)
    limits = carried if carried is not None else (profile.limits if profile else None)
    return {
        "decision": decision.decision,
        "rule": decision.rule,
        "policy_version_hash": profile.policy_version_hash if profile else policy_version_hash,
        "reason": redact_text(decision.reason) if decision.reason else None,
        "limits": limits,
        "timeout_ms": profile.timeout_ms if profile else None,
    }
