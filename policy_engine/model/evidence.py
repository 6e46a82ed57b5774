"""Execution results and begin/end evidence records (seed 000 §2.4, §7; seed 004 fields)."""

from __future__ import annotations

import hashlib
from binascii import b2a_base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from policy_engine.model.enums import SideEffect
from policy_engine.model.limits import Limits, Usage
from policy_engine.model.profile import RuleRef
from policy_engine.model.unchecked import assembled


class Digest(BaseModel):
    """SHA-256 of some content, base64, with its size; stands in for content in evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algo: Literal["sha256"] = "sha256"
    b64: str
    size: int

    @staticmethod
    def of(data: bytes) -> Digest:
        # assembled: both values are made here, of their fields' types (≈ 1 µs a digest)
        return assembled(Digest, {"algo": "sha256",
                                  "b64": b2a_base64(hashlib.sha256(data).digest(),
                                                    newline=False).decode(),
                                  "size": len(data)}, _DIGEST_GIVEN)


_DIGEST_GIVEN = frozenset({"b64", "size"})


class SideEffectRec(BaseModel):
    """A summary of one side effect (file, network, process): metadata only, never content."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SideEffect
    meta: dict[str, Any] = Field(default_factory=dict)


class ExecResult(BaseModel):
    """Public result of one call: digests and handles, not raw sensitive content."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    code: str | None = None
    message: str | None = None
    out: dict[str, Any] = Field(default_factory=dict)
    used: Usage = Field(default_factory=Usage)


# id(record) -> (record, its JSON); entries are added and read under the GIL (atomic dict calls)
_RENDERED: dict[int, tuple[BaseModel, bytes]] = {}
_RENDERED_MAX = 256  # a call reads its records back within itself: a few per thread


class _Rendered(BaseModel):
    """A record's JSON rendered once: every sink writing it and the `/v1/ops` answer carrying
    the end record share the bytes (issue 27: one rendering per record, not one per use)."""

    def json_bytes(self) -> bytes:
        """``model_dump_json()`` as UTF-8 bytes, rendered on first use.

        INVARIANT: a record is not changed after it is first written (the models are frozen;
        their free-form dicts are built for the record and not touched again).
        """
        # remembered by identity in a small table, not in a pydantic private attribute: one
        # costs its default's resolution at every construction and a ``__getattr__`` at every
        # read (≈ 2 % of a `/v1/ops` call; docs/benchmarks.md, "Twelfth pass"). The entry
        # holds the record, so its id cannot be another's while remembered; a copy
        # (model_copy, copy.copy) is another object and renders again
        hit = _RENDERED.get(id(self))
        if hit is not None and hit[0] is self:
            return hit[1]
        rendered = self._render()
        if len(_RENDERED) >= _RENDERED_MAX:
            _RENDERED.clear()  # a cache, not a limit: a record dropped renders again
        _RENDERED[id(self)] = (self, rendered)
        return rendered

    def _render(self) -> bytes:
        # the serializer's own bytes: ``model_dump_json()`` decodes them to a str, which
        # ``.encode()`` made bytes again (the same bytes)
        return self.__pydantic_serializer__.to_json(self)

    def __eq__(self, other: object) -> bool:
        # the rendering is a cache, not part of the record: two equal records are equal
        # whether or not either was rendered (pydantic compares private attributes too)
        if not isinstance(other, BaseModel) or type(other) is not type(self):
            return NotImplemented
        return bool(self.__dict__ == other.__dict__
                    and self.__pydantic_extra__ == other.__pydantic_extra__)

    __hash__ = BaseModel.__hash__


class EvidenceBegin(_Rendered):
    """Written before an operation runs (and for a denial, before the refusal is returned)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["begin"] = "begin"
    envelope_id: str
    tenant: str
    subject_id: str
    tool_name: str
    call_id: str
    profile_hash: str
    capability: str = Field(description='e.g. "net.http:GET:https://example.com"')
    inputs_digest: Digest
    produced_at_ms: int
    policy_version_hash: str
    replay: dict[str, Any] | None = Field(
        default=None, description="what `policy-engine replay` needs to decide the call again "
        "(policy_engine/recording/record.py): the redacted op, grant, manifest, settings")
    shadow: dict[str, Any] | None = Field(
        default=None, description="what the shadow (audit) policy would decide, unenforced "
        "(policy_engine/recording/shadow.py): decision, code, rule, would_deny")
    annotations: dict[str, Any] | None = Field(
        default=None, description="what the caller established before the call, recorded with "
        "it: `consent` (the confirmation service's question and answer: who, when, for what, "
        "until when) and `risk` (run_code's static risk hint: level, patterns, language); "
        "hints only, the decision never reads them from here")

    def _render(self) -> bytes:
        # the free-form members last, each by its own field's serializer (``_FREE``): pydantic
        # walks a ``dict[str, Any]`` more slowly inside the model than alone (≈ 1.3 µs a
        # record; docs/benchmarks.md "Thirteenth pass"); the same bytes
        d = self.__dict__
        head = self.__pydantic_serializer__.to_json(self, exclude=_BEGIN_FREE)
        return b"".join((head[:-1], b',"replay":', _free(d["replay"]), b',"shadow":',
                         _free(d["shadow"]), b',"annotations":', _free(d["annotations"]), b"}"))


class EvidenceEnd(_Rendered):
    """Written after an operation ends, whatever the outcome ("failure is always recorded")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["end"] = "end"
    envelope_id: str
    status: Literal["ok", "denied", "error"]
    error_code: str | None = None
    outputs_digest: Digest
    side_effects: tuple[SideEffectRec, ...] = ()
    budget_used: Usage = Field(default_factory=Usage)
    finished_at_ms: int
    sandbox_backend: str | None = None
    sandbox_profile: str | None = None
    sandbox_network_mode: str | None = None
    sandbox_latency_ms: float | None = None
    sandbox_timed_out: bool = False
    sandbox_success: bool = False
    sandbox_error_kind: str | None = None
    sandbox_degraded: bool = False
    sandbox_degrade_reason: str | None = None
    # the decision this call ran under (issue 14): which rule, which policy, why, what limits
    decision: Literal["allow", "deny"] | None = None
    rule: RuleRef | None = None
    policy_version_hash: str | None = None
    reason: str | None = None
    limits: Limits | None = None
    timeout_ms: int | None = None

    def _render(self) -> bytes:
        # the decision's members (the last six) are the same for every call a decision
        # allows under one compiled profile (the same rule and limits objects): their JSON is
        # kept and the rest rendered alone (≈ 1.7 µs a record; docs/benchmarks.md
        # "Thirteenth pass"); the same bytes
        d = self.__dict__
        rule, limits = d["rule"], d["limits"]
        key = (id(rule), id(limits), d["decision"], d["policy_version_hash"], d["reason"],
               d["timeout_ms"])
        kept = _DECIDED.get(key)
        if kept is not None and kept[0] is rule and kept[1] is limits:
            return self.__pydantic_serializer__.to_json(
                self, exclude=_END_DECIDED)[:-1] + kept[2]
        whole = self.__pydantic_serializer__.to_json(self)
        # the last `,"decision":` is the member's: a string cannot hold the sequence unescaped
        # and nothing after the member (rule, limits) has a key of that name
        cut = whole.rfind(b',"decision":')
        if cut > 0:
            if len(_DECIDED) >= _DECIDED_MAX:
                _DECIDED.clear()  # a cache, not a limit
            _DECIDED[key] = (rule, limits, whole[cut:])  # holds them: their ids stay theirs
        return whole


_BEGIN_FREE: set[str] = {"replay", "shadow", "annotations"}  # never changed
# those members' own type, so their own serializer
_FREE_JSON: TypeAdapter[dict[str, Any] | None] = TypeAdapter(dict[str, Any] | None)


_FREE_TO_JSON = _FREE_JSON.serializer.to_json  # ``dump_json`` less its Python frame


def _free(value: dict[str, Any] | None) -> bytes:
    return b"null" if value is None else _FREE_TO_JSON(value)


_END_DECIDED: set[str] = {"decision", "rule", "policy_version_hash", "reason", "limits",
                          "timeout_ms"}  # never changed
_DECIDED: dict[tuple[Any, ...], tuple[RuleRef | None, Limits | None, bytes]] = {}
_DECIDED_MAX = 1024
