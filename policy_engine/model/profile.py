"""The Profile: the narrowest capability intersection and strictest limits for one call."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from policy_engine.model.capability import Capability
from policy_engine.model.enums import (
    CapabilityKind,
    Isolation,
    NetworkMode,
    SafetyClass,
    SideEffect,
)
from policy_engine.model.grant import Consent
from policy_engine.model.limits import AllowLists, Budget, DenyLists, Limits, Mappings
from policy_engine.model.readonly import LayerMap


class RuleRef(BaseModel):
    """Where a rule was written: its id and source position."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    file: str
    line: int
    column: int


class ProfileCapability(BaseModel):
    """One allowed capability of the profile.

    ``all_of`` is a conjunction: a resource is admitted only if every member admits it. The meet
    folds it to one member whenever one pattern is provably the narrower; it keeps several only
    where no single pattern expresses the intersection (DESIGN.md §2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: CapabilityKind
    all_of: tuple[Capability, ...] = Field(min_length=1)
    rule: RuleRef | None = None
    condition: str | None = Field(default=None, description="CEL source of the rule's `when`")
    limits: Limits | None = Field(default=None, description="per-rule limits, already met")
    limit_layers: LayerMap | None = Field(
        default=None, description="with `limits`: per field, the layer that set it")


class ProfileDeny(BaseModel):
    """A forbid rule carried into the profile; mandatory ones can never be lifted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kinds: tuple[CapabilityKind, ...]
    capability: Capability
    rule: RuleRef
    condition: str | None = None
    mandatory: bool = False


class Profile(BaseModel):
    """Grant ∩ manifest ∩ policy for one call (seed 000 §2.3), with a stable ``profile_hash``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str
    subject_id: str
    tool_name: str
    call_id: str
    name: str | None = Field(default=None, description="named profile applied, if any")
    capabilities: tuple[ProfileCapability, ...] = ()
    denies: tuple[ProfileDeny, ...] = ()
    granted: tuple[Capability, ...] = Field(default=(), description="the grant's capabilities")
    declared: tuple[Capability, ...] = Field(default=(), description="the manifest's permissions")
    safety: SafetyClass
    side_effects: tuple[SideEffect, ...]
    limits: Limits
    limit_layers: LayerMap = Field(
        default_factory=dict, description="per limit field, the layer that set it")
    budget: Budget
    allow: AllowLists
    deny: DenyLists
    mappings: Mappings
    network: NetworkMode
    # left out of the JSON (and so of profile_hash) when unset: profiles that require nothing
    # hash as they did before the field existed
    isolation: Isolation | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="isolation the backend must provide (a named profile's `isolation`); "
                    "refused, never degraded, where it cannot")
    timeout_ms: int
    consent_required: bool
    consent: Consent | None = None
    expires_at: int
    policy_name: str
    policy_version: str
    policy_version_hash: str
    manifest_version: str
    profile_hash: str = ""
