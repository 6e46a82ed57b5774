"""A call's begin and end records, result and usage, built without validating again what the
orchestrator already holds in its validated form (issue 27).

Each of these models was validated field by field on every call (≈ 3–5 µs each, four to six
per call: docs/benchmarks.md "Thirteenth pass"), though every value the orchestrator gives them
is already of its field's type: strings, integers, the frozen digests, rules, limits and
usage it made or was given validated. ``assembled`` makes the instance pydantic's own
``model_construct`` makes (the same ``__dict__``, fields set and extras) without its per-field
Python loop, with ``model.unchecked``'s setters, as per-call profiles and decisions are made.
Each builder checks the few values that could arrive in another type
(from an injected clock or id source, a third-party executor's side effects or amounts, a
caller's annotations) and validates as before when any does, so a record is the same object,
with the same bytes, either way (``tests/unit/test_orchestration_records.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.model import (
    Digest,
    EvidenceBegin,
    EvidenceEnd,
    ExecResult,
    Limits,
    SideEffectRec,
    Usage,
)
from policy_engine.model.profile import RuleRef
from policy_engine.model.unchecked import assembled

_END_GIVEN = frozenset(EvidenceEnd.model_fields) - {"type"}
_BEGIN_GIVEN = frozenset(EvidenceBegin.model_fields) - {"type"}
_USAGE_GIVEN = frozenset(Usage.model_fields)
_OK_GIVEN = frozenset({"ok", "out", "used"})
_FAILED_GIVEN = frozenset({"ok", "code", "message", "used"})
_OPTIONAL_STR = (str, type(None))


def usage_of(values: Mapping[str, Any]) -> Usage:
    """``Usage(**values)`` (every field given)."""
    if all(type(values[k]) is int for k in _USAGE_GIVEN):
        return assembled(Usage, {k: values[k] for k in Usage.model_fields}, _USAGE_GIVEN)
    return Usage(**values)


def ok_result(out: dict[str, Any], used: Usage) -> ExecResult:
    """``ExecResult(ok=True, out=out, used=used)``: ``out`` is an executor's validated
    result's, kept as it is."""
    if type(out) is dict and type(used) is Usage:
        return assembled(ExecResult, {"ok": True, "code": None, "message": None, "out": out,
                                      "used": used}, _OK_GIVEN)
    return ExecResult(ok=True, out=out, used=used)


def failed_result(code: str, message: str, used: Usage) -> ExecResult:
    """``ExecResult(ok=False, code=code, message=message, used=used)``."""
    if type(code) is str and type(message) is str and type(used) is Usage:
        return assembled(ExecResult, {"ok": False, "code": code, "message": message,
                                      "out": {}, "used": used}, _FAILED_GIVEN)
    return ExecResult(ok=False, code=code, message=message, used=used)


def begin_record(values: dict[str, Any]) -> EvidenceBegin:
    """``EvidenceBegin(**values)`` (every field but ``type``, in the model's order)."""
    annotations = values["annotations"]
    if type(values["envelope_id"]) is str and type(values["produced_at_ms"]) is int and \
            type(values["inputs_digest"]) is Digest and \
            all(type(values[k]) is dict or values[k] is None
                for k in ("replay", "shadow", "annotations")) and \
            (annotations is None or all(type(k) is str for k in annotations)) and \
            (values["shadow"] is None or all(type(k) is str for k in values["shadow"])):
        # ``replay`` is the recorder's own (recording/record.py: literal names only)
        return assembled(EvidenceBegin, {"type": "begin", **values}, _BEGIN_GIVEN)
    return EvidenceBegin(**values)


def end_record(values: dict[str, Any]) -> EvidenceEnd:
    """``EvidenceEnd(**values)`` (every field but ``type``, in the model's order)."""
    if type(values["envelope_id"]) is str and type(values["finished_at_ms"]) is int and \
            type(values["outputs_digest"]) is Digest and \
            type(values["budget_used"]) is Usage and \
            type(values["side_effects"]) is tuple and \
            all(type(e) is SideEffectRec for e in values["side_effects"]) and \
            type(values["error_code"]) in _OPTIONAL_STR and \
            type(values["sandbox_error_kind"]) in _OPTIONAL_STR and \
            type(values["sandbox_latency_ms"]) is float and \
            (values["rule"] is None or type(values["rule"]) is RuleRef) and \
            (values["limits"] is None or type(values["limits"]) is Limits) and \
            type(values["timeout_ms"]) in (int, type(None)):
        return assembled(EvidenceEnd, {"type": "end", **values}, _END_GIVEN)
    return EvidenceEnd(**values)
