"""Grants (per-call authorization tickets), consent and tool manifests."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from policy_engine.model.capability import Capability
from policy_engine.model.enums import NetworkMode, SafetyClass, SideEffect
from policy_engine.model.limits import Budget, Limits, check_root_path
from policy_engine.model.text import reject_lone_surrogates


class Consent(BaseModel):
    """A human's recorded consent for a high-risk call (checked for presence and freshness)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    granted_by: str = Field(min_length=1)
    granted_at: int = Field(description="ms since epoch")
    expires_at: int = Field(description="ms since epoch")
    scope: str | None = None


class Grant(BaseModel):
    """Authorization for one tool call (seed 000 §2.2)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any, info: ValidationInfo) -> Any:
        return reject_lone_surrogates(data, info)

    tenant: str = Field(min_length=1)
    subject_id: str = Field(min_length=1)
    tool_name: str = Field(min_length=1)
    call_id: str = Field(min_length=1)
    capabilities: tuple[Capability, ...] = ()
    expires_at: int = Field(description="ms since epoch")
    budget: Budget = Budget()
    decision_key_fingerprint: str = ""
    consent: Consent | None = None
    limits: Limits = Limits()


class Manifest(BaseModel):
    """What a tool declares about itself (seed 000 §8, seed 002 §7)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any, info: ValidationInfo) -> Any:
        return reject_lone_surrogates(data, info)

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    description: str = ""
    permissions: tuple[Capability, ...] = ()
    side_effects: tuple[SideEffect, ...] = (SideEffect.NONE,)
    safety_class: SafetyClass = SafetyClass.LOW
    input_schema: dict[str, Any] = Field(default_factory=dict)
    output_schema: dict[str, Any] = Field(default_factory=dict)
    limits: Limits = Limits()
    network: NetworkMode | None = None
    profile: str | None = Field(default=None, description="named profile the tool asks for")


class Settings(BaseModel):
    """Operator settings layer of the chain system default ← settings ← manifest ← overrides."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limits: Limits = Limits()
    network: NetworkMode | None = None
    root_fs: str | None = None
    tmp_dir: str | None = None
    session: str | None = None
    """The calling session's workspace directory, the value of a policy's ``$SESSION`` path
    variable. Only the engine sets it (the session runtime, per call); a document cannot
    (policy_engine/documents.py), so a call outside a session leaves ``$SESSION`` unresolved."""

    @field_validator("root_fs", "tmp_dir", "session")
    @classmethod
    def _root(cls, value: str | None) -> str | None:
        return check_root_path(value)


class Overrides(BaseModel):
    """Per-request overrides: may only narrow. A widening value is refused naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limits: Limits = Limits()
    network: NetworkMode | None = None
    profile: str | None = None
