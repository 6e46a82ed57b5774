"""The typed documents the service answers (docs/service.md, docs/sessions.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policy_engine.refusal import ConsentSeen, Refusal


def refusal_from(doc: dict[str, Any]) -> Refusal:
    """The one refusal shape from its JSON document."""
    consent = doc.get("consent") or {}
    return Refusal(code=str(doc["code"]), http_status=int(doc["http_status"]),
                   retryable=bool(doc.get("retryable")), message=str(doc.get("message", "")),
                   refused_by=doc.get("refused_by", "service"), rule=doc.get("rule"),
                   consent=ConsentSeen(bool(consent.get("asked")), consent.get("answer"),
                                       consent.get("by"), consent.get("at")),
                   envelope_id=doc.get("envelope_id"), location=doc.get("location"))


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    tenant: str
    subject: str
    security_mode: str
    backend: str
    created_ms: int
    expires_ms: int
    status: str

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Session:
        return cls(doc["session_id"], doc["tenant"], doc["subject"], doc["security_mode"],
                   doc["backend"], doc["created_ms"], doc["expires_ms"], doc["status"])


@dataclass(frozen=True, slots=True)
class CodeResult:
    """One run_code call's record; ``exec_id`` is its evidence envelope."""

    success: bool
    stdout: str
    stderr: str
    exit_code: int | None
    sandbox_type: str
    error_code: str | None
    exec_id: str
    refusal: Refusal | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    interpreter: dict[str, Any] | None = None
    """A stateful call's interpreter: ``generation``, ``fresh``, ``state_lost``, ``crashed``."""

    @classmethod
    def of(cls, doc: dict[str, Any]) -> CodeResult:
        ref = doc.get("refusal")
        return cls(doc["success"], doc["stdout"], doc["stderr"], doc.get("exit_code"),
                   doc["sandbox_type"], doc.get("error_code"), doc["exec_id"],
                   refusal_from(ref) if ref else None, doc, interpreter=doc.get("interpreter"))


@dataclass(frozen=True, slots=True)
class Exec:
    """An exec of a session: ``queued`` or ``running``, then ``completed`` or ``cancelled``."""

    exec_id: str
    session_id: str
    status: str
    result: CodeResult | None

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Exec:
        res = doc.get("result")
        return cls(doc["exec_id"], doc["session_id"], doc["status"],
                   CodeResult.of(res) if res else None)


@dataclass(frozen=True, slots=True)
class OutputEvent:
    """One streamed chunk (``stdout``/``stderr``) or the ``end`` event with the final exec."""

    event: str
    seq: int | None = None
    text: str = ""
    final: Exec | None = None


@dataclass(frozen=True, slots=True)
class FileWritten:
    path: str
    size: int
    envelope_id: str


@dataclass(frozen=True, slots=True)
class OpOutcome:
    """`/v1/ops`: the run document; ``envelope_id`` names its evidence."""

    ok: bool
    envelope_id: str
    result: dict[str, Any]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class SkillResult:
    """A skill invoked in a session: its declared outputs and the call's evidence id."""

    skill: str
    ok: bool
    output: dict[str, Any]
    envelope_id: str

    @classmethod
    def of(cls, doc: dict[str, Any]) -> SkillResult:
        return cls(str(doc["skill"]), bool(doc["ok"]), dict(doc["output"]),
                   str(doc["envelope_id"]))
