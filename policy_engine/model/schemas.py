"""JSON Schemas of the public model, by name (what `policy-engine schema` prints)."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from policy_engine.model.capability import Capability
from policy_engine.model.decision import Decision
from policy_engine.model.evidence import Digest, EvidenceBegin, EvidenceEnd, ExecResult
from policy_engine.model.grant import Grant, Manifest, Overrides, Settings
from policy_engine.model.limits import Budget, Limits
from policy_engine.model.ops import ExecOp
from policy_engine.model.profile import Profile

SCHEMA_TYPES: dict[str, Any] = {
    "capability": Capability,
    "grant": Grant,
    "manifest": Manifest,
    "settings": Settings,
    "overrides": Overrides,
    "limits": Limits,
    "budget": Budget,
    "profile": Profile,
    "exec-op": ExecOp,
    "exec-result": ExecResult,
    "evidence-begin": EvidenceBegin,
    "evidence-end": EvidenceEnd,
    "digest": Digest,
    "decision": Decision,
}


def json_schema(name: str, types: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, as pydantic emits it) of the named type."""
    schema: dict[str, Any] = TypeAdapter((types or SCHEMA_TYPES)[name]).json_schema()
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    schema.setdefault("title", name)
    return schema
