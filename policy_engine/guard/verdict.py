"""The guard's answers: the prebuilt allow, a deny built without validation, a failure's deny."""

from __future__ import annotations

from typing import Any

from policy_engine.errors import REGISTRY, ErrorCode, PolicyEngineError
from policy_engine.guard.compiled import CompiledCap
from policy_engine.guard.paths import quote
from policy_engine.guard.resolve import Resolved
from policy_engine.guard.steps import with_request_timeout
from policy_engine.guard.tracer import Tracer
from policy_engine.model import Decision, Profile, RuleRef, TraceStep
from policy_engine.model.unchecked import SET_DICT, SET_EXTRA, SET_FIELDS_SET, SET_PRIVATE

_STATUS: dict[ErrorCode, tuple[str, int]] = {c: (c.value, REGISTRY[c].http_status)
                                             for c in ErrorCode}


def failed(profile: object, exc: Exception, tr: Tracer | None) -> Decision:
    """The deny for a decision that raised: a resolver's refusal (``PolicyEngineError``) with its
    own code, anything else an internal error (never an allow)."""
    if isinstance(exc, PolicyEngineError):
        if tr is not None:
            tr.step("resolve", "fail", detail=exc.reason)
        return deny(hash_of(profile), exc.code, exc.reason, None, tr)
    if tr is not None:
        tr.step("decision", "fail", detail=type(exc).__name__)
    return deny(hash_of(profile), ErrorCode.UNKNOWN_INTERNAL, "internal error in the guard",
                None, tr)


def allow(chosen: CompiledCap, kind: str, op: Any, phash: str) -> Decision:
    """The prebuilt allow, or a copy whose timeout is the op's own when that is narrower.

    A compilation shared by per-call profiles of one shape carries the first one's hash: the
    answer names this call's profile."""
    answer = chosen.allow
    if answer.profile_hash != phash:
        answer = _restamp(answer, phash)
    if kind == "proc.exec" and op.timeout_ms and answer.limits is not None and \
            op.timeout_ms < (answer.limits.timeout_ms or op.timeout_ms + 1):
        return with_request_timeout(answer, op.timeout_ms)
    return answer


def describe(rv: Resolved | None, path: str | None) -> str:
    """Public text of the resource; built only for a deny or a trace."""
    return rv.describe() if rv is not None else quote(path or "")


def hash_of(profile: object) -> str:
    return profile.profile_hash if isinstance(profile, Profile) else ""


def _restamp(answer: Decision, phash: str) -> Decision:
    """``answer`` naming profile ``phash``: a field copy of a model the guard built itself."""
    d = _NEW(Decision)
    fields = d.__dict__
    fields.update(answer.__dict__)
    fields["profile_hash"] = phash
    # shared, as ``deny`` shares its set: pydantic copies it before changing it (model_copy)
    SET_FIELDS_SET(d, answer.__pydantic_fields_set__)
    SET_EXTRA(d, None)
    SET_PRIVATE(d, None)
    return d


_NEW = Decision.__new__
# ``__dict__`` is filled in place and the slots set with their own setters (model.unchecked):
# ≈ 0.2 µs a decision less than ``object.__setattr__``
_FIELDS_SET = set(Decision.model_fields)
"""Every deny's ``__pydantic_fields_set__``: one set shared by all (never changed in place;
``model_copy`` copies it first), not a copy per decision."""


_DENIES: dict[str, tuple[ErrorCode, RuleRef | None, str, Decision]] = {}
"""Untraced denies by reason, each with the code, rule and profile hash it was built for: a
deny is frozen, so a repeated one (the same refusal of the same resource under the same
profile) is answered with the object built the first time (≈ 0.5 µs of building a model)."""
_DENIES_MAX = 2048


def deny(phash: str, code: ErrorCode, reason: str, rule: RuleRef | None,
         tr: Tracer | None) -> Decision:
    """A deny, built as ``Decision.model_construct`` builds it, without its per-field loop.

    Every value is produced by the guard (a registry code and its status, a reason string, the
    rule of a compiled profile), so validation would only re-check our own output;
    ``tests/unit/test_guard_decide.py`` checks the result equals the validated model. Untraced,
    an equal deny built before is answered instead (``_DENIES``; the same rule object, the same
    profile hash, the same code and reason).
    """
    trace: tuple[TraceStep, ...] | None = None
    if tr is not None:
        tr.step("decision", "deny", rule, reason)
        trace = tr.freeze()
    else:
        hit = _DENIES.get(reason)
        if hit is not None and hit[0] is code and hit[1] is rule and hit[2] == phash:
            return hit[3]
    value, status = _STATUS[code]
    d = _NEW(Decision)
    # one dict display set as the ``__dict__``: ≈ 25 bytecodes less than a store a field
    SET_DICT(d, {"decision": "deny", "code": value, "http_status": status, "reason": reason,
                 "rule": rule, "profile_hash": phash, "trace": trace, "limits": None,
                 "limit_layers": None})
    SET_FIELDS_SET(d, _FIELDS_SET)
    SET_EXTRA(d, None)
    SET_PRIVATE(d, None)
    if trace is None:
        if len(_DENIES) >= _DENIES_MAX:
            _DENIES.clear()  # a cache, not a limit: a miss costs one build
        _DENIES[reason] = (code, rule, phash, d)
    return d
