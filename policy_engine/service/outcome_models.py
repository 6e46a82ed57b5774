"""The OpenAPI declarations of `/v1/ops` and `/v1/decide` outcomes: every field typed, a denial
keeping its `result`, `refusal` and `envelope_id` (a generated client reads them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from policy_engine.model import Profile
from policy_engine.model.decision import Decision, TraceStep
from policy_engine.model.evidence import EvidenceEnd, ExecResult
from policy_engine.model.profile import RuleRef
from policy_engine.service.models import ErrorBody, ErrorDetail, RefusalBody


class ConsentAnswered(BaseModel):
    """The confirmation service's answer when one was asked."""

    model_config = ConfigDict(extra="allow")
    approved: bool
    kind: str
    by: str | None = None


class OpDocument(BaseModel):
    """`POST /v1/ops`: the run document. On a refusal or failure it answers the code's HTTP
    status with the same fields and `error` + `refusal` beside them."""

    result: ExecResult
    decision: Decision
    envelope_id: str = Field(description="the evidence envelope of the call")
    evidence: EvidenceEnd
    consent: ConsentAnswered | None = None
    refusal: RefusalBody | None = Field(default=None, description="when refused or failed")
    error: ErrorDetail | None = Field(default=None, description="when refused or failed")


class LimitShown(BaseModel):
    value: int | float | None
    layer: str = Field(description="the layer that set it (built-in, defaults, rule, op…)")


class PolicyShown(BaseModel):
    name: str
    version: str
    version_hash: str


class ToolShown(BaseModel):
    name: str
    version: str


class DecideCompact(BaseModel):
    """`POST /v1/decide` (the default): what a caller acts on (service/decide_answer.py)."""

    decision: Literal["allow", "deny"]
    code: str | None
    http_status: int
    reason: str | None
    rule: RuleRef | None
    limits: dict[str, LimitShown]
    profile_hash: str | None
    backend_requires: list[str]
    policy: PolicyShown
    tool: ToolShown


class DecideDocument(BaseModel):
    """`POST /v1/decide?explain=full`: the `explain --format json` document (a dry run)."""

    decision: Literal["allow", "deny"]
    code: str | None
    http_status: int
    reason: str | None
    rule: RuleRef | None
    profile: Profile | None
    backend_requires: list[str]
    trace: list[TraceStep]
    refused_by: list[str]
    limits: dict[str, LimitShown]
    op: dict[str, Any] = Field(description="the op in the redacted form evidence records")
    policy: PolicyShown
    tool: ToolShown


# statuses a run's refusal answers (the error registry's): the run document or, for a request
# refused before any decision (token, body), the error document
OP_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": OpDocument, "description": "the call ran"},
    **{status: {"model": OpDocument | ErrorBody, "description": "refused or failed: the run "
                "document with `error` and `refusal`, or the error document when the "
                "request was refused before a decision"}
       for status in (403, 429, 500, 503, 504)}}
DECIDE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": DecideCompact | DecideDocument,
          "description": "the decision (allow or deny): the compact answer, or with "
                         "`explain=full` the explain document"}}
