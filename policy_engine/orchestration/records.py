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
from operator import itemgetter
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
_DICT_OR_NONE = (dict, type(None))
_INT, _STR, _EFFECT = {int}, {str}, {SideEffectRec}
_USAGE_FIELDS = tuple(Usage.model_fields)
_USAGE_VALUES = itemgetter(*_USAGE_FIELDS)


def usage_of(values: Mapping[str, Any]) -> Usage:
    """``Usage(**values)`` (every field given)."""
    # the checks below are C calls, not generators (≈ 1 µs each on every call)
    ordered = _USAGE_VALUES(values)
    if set(map(type, ordered)) == _INT:
        return assembled(Usage, dict(zip(_USAGE_FIELDS, ordered, strict=True)), _USAGE_GIVEN)
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
    annotations, shadow = values["annotations"], values["shadow"]
    if type(values["envelope_id"]) is str and type(values["produced_at_ms"]) is int and \
            type(values["inputs_digest"]) is Digest and \
            type(values["replay"]) in _DICT_OR_NONE and type(shadow) in _DICT_OR_NONE and \
            type(annotations) in _DICT_OR_NONE and \
            (not annotations or set(map(type, annotations)) == _STR) and \
            (not shadow or set(map(type, shadow)) == _STR):
        # ``replay`` is the recorder's own (recording/record.py: literal names only)
        return assembled(EvidenceBegin, {"type": "begin", **values}, _BEGIN_GIVEN)
    return EvidenceBegin(**values)


def end_record(values: dict[str, Any]) -> EvidenceEnd:
    """``EvidenceEnd(**values)`` (every field but ``type``, in the model's order)."""
    if type(values["envelope_id"]) is str and type(values["finished_at_ms"]) is int and \
            type(values["outputs_digest"]) is Digest and \
            type(values["budget_used"]) is Usage and \
            type(values["side_effects"]) is tuple and \
            set(map(type, values["side_effects"])) <= _EFFECT and \
            type(values["error_code"]) in _OPTIONAL_STR and \
            type(values["sandbox_error_kind"]) in _OPTIONAL_STR and \
            type(values["sandbox_latency_ms"]) is float and \
            (values["rule"] is None or type(values["rule"]) is RuleRef) and \
            (values["limits"] is None or type(values["limits"]) is Limits) and \
            type(values["timeout_ms"]) in (int, type(None)):
        return assembled(EvidenceEnd, {"type": "end", **values}, _END_GIVEN)
    return EvidenceEnd(**values)
