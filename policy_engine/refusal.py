"""The one refusal shape every face answers with (docs/refusal.schema.json) and its exception.

A refusal says what code it is, who refused (``refused_by``), which rule decided when one did,
what consent was asked and answered, and which evidence envelope records it. HTTP bodies, MCP
``structuredContent``, run_code results, exec records and :class:`PolicyRefusal` all carry this
same document, so a client reads one shape whichever face it called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from policy_engine.errors import ErrorCode, PolicyEngineError, spec_of

RefusedBy = Literal["policy", "manifest", "grant", "limits", "consent", "backend", "service"]
ConsentAnswerKind = Literal["approved", "refused", "timed_out", "no_service"]
REFUSED_BY: tuple[str, ...] = ("policy", "manifest", "grant", "limits", "consent", "backend",
                               "service")
CONSENT_ANSWERS: tuple[str, ...] = ("approved", "refused", "timed_out", "no_service")


@dataclass(frozen=True, slots=True)
class ConsentSeen:
    """What consent a call met: whether an approver was asked, its answer, who and when."""

    asked: bool = False
    answer: ConsentAnswerKind | None = None
    by: str | None = None
    at: int | None = None  # ms since the epoch

    def to_json(self) -> dict[str, Any]:
        return {"asked": self.asked, "answer": self.answer, "by": self.by, "at": self.at}


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal, as every face renders it (``to_json`` is the schema's document)."""

    code: str
    http_status: int
    retryable: bool
    message: str
    refused_by: RefusedBy
    rule: dict[str, Any] | None = None  # {"id", "file", "line", "column"} when a rule decided
    consent: ConsentSeen = field(default_factory=ConsentSeen)
    envelope_id: str | None = None
    location: str | None = None  # where malformed input broke (a JSON pointer or field path)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "code": self.code, "http_status": self.http_status, "retryable": self.retryable,
            "message": self.message, "refused_by": self.refused_by, "rule": self.rule,
            "consent": self.consent.to_json(), "envelope_id": self.envelope_id,
            "location": self.location}
        return data


def engine_refusal(err: PolicyEngineError, refused_by: RefusedBy, *,
                   envelope_id: str | None = None, location: str | None = None) -> Refusal:
    """The refusal of an engine error raised before any decision (bad input, a face check)."""
    view = err.public_view()
    return Refusal(view["code"], view["http_status"], view["retryable"], view["message"],
                   refused_by, envelope_id=envelope_id, location=location)


def code_refusal(code: str, http_status: int, message: str, refused_by: RefusedBy, *,
                 retryable: bool | None = None, envelope_id: str | None = None,
                 location: str | None = None) -> Refusal:
    """A refusal of any stable code (the registry's or a face's own, e.g. ``AUTH.*``)."""
    if retryable is None:
        retryable = (spec_of(ErrorCode(code)).retryable
                     if code in ErrorCode._value2member_map_ else False)
    return Refusal(code, http_status, retryable, message, refused_by, envelope_id=envelope_id,
                   location=location)


class PolicyRefusal(PolicyEngineError):
    """A refused call as a Python exception, with the refusal's attributes (``code`` is the
    :class:`ErrorCode` when the registry has it; ``refusal`` is the whole document)."""

    def __init__(self, refusal: Refusal) -> None:
        known = refusal.code in ErrorCode._value2member_map_
        super().__init__(ErrorCode(refusal.code) if known else ErrorCode.UNKNOWN_INTERNAL,
                         refusal.message)
        self.refusal = refusal
        self.message = refusal.message
        self.refused_by = refusal.refused_by
        self.rule = refusal.rule
        self.consent = refusal.consent
        self.envelope_id = refusal.envelope_id

    def __str__(self) -> str:
        return f"{self.refusal.code}: {self.refusal.message}"

    @property
    def http_status(self) -> int:
        return self.refusal.http_status

    @property
    def retryable(self) -> bool:
        return self.refusal.retryable

    def public_message(self) -> str:
        return self.refusal.message

    def public_view(self) -> dict[str, Any]:
        return {"code": self.refusal.code, "http_status": self.refusal.http_status,
                "retryable": self.refusal.retryable, "message": self.refusal.message}

    def to_json(self) -> dict[str, Any]:
        return self.refusal.to_json()


def refusal_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of :meth:`Refusal.to_json` (docs/refusal.schema.json)."""
    nullable_str = {"type": ["string", "null"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://policy-engine.dev/schemas/refusal.json",
        "title": "Refusal",
        "description": "one refused or failed call, the same on every face (docs/service.md)",
        "type": "object",
        "required": ["code", "http_status", "retryable", "message", "refused_by", "rule",
                     "consent", "envelope_id", "location"],
        "additionalProperties": False,
        "properties": {
            "code": {"type": "string", "description": "stable error code (docs/error-codes.md)"},
            "http_status": {"type": "integer", "minimum": 400, "maximum": 599},
            "retryable": {"type": "boolean"},
            "message": {"type": "string", "description": "public, redacted"},
            "refused_by": {"enum": list(REFUSED_BY)},
            "rule": {"oneOf": [{"type": "null"}, {
                "type": "object", "required": ["id"], "properties": {
                    "id": {"type": "string"}, "file": {"type": "string"},
                    "line": {"type": "integer"}, "column": {"type": "integer"}}}]},
            "consent": {
                "type": "object", "required": ["asked", "answer", "by", "at"],
                "additionalProperties": False,
                "properties": {"asked": {"type": "boolean"},
                               "answer": {"enum": [*CONSENT_ANSWERS, None]},
                               "by": nullable_str, "at": {"type": ["integer", "null"]}}},
            "envelope_id": nullable_str,
            "location": {"type": ["string", "null"],
                         "description": "where malformed input broke (JSON pointer or path)"},
        },
    }
