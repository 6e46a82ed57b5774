"""The compiled policy (decision graph input): rules indexed by capability kind, deny-overrides.

The compiler (``policy_engine.compiler``) produces a :class:`PolicySet`; the profile builder and
the guard only read it. Nothing here parses or evaluates anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from policy_engine.errors import Span
from policy_engine.model import (
    Capability,
    CapabilityKind,
    Isolation,
    Limits,
    Manifest,
    NetworkMode,
    RuleRef,
)


class CompiledCondition(Protocol):
    """A CEL ``when`` condition compiled (and type-checked) once at policy compile time."""

    source: str
    span: Span

    def evaluate(self, context: Mapping[str, object]) -> tuple[bool, str | None]:
        """Evaluate against ``context`` (request, grant, manifest, profile, tenant, subject, now).

        :returns: ``(value, None)`` on success, ``(False, message)`` on a runtime error — an error
            never allows anything.
        """
        ...


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One ``permit`` or ``forbid`` rule, with one capability (its resources) per kind it names.

    :param mandatory: a mandatory deny; nothing (grant, manifest, override, named profile) lifts it.
    """

    id: str
    effect: Literal["permit", "forbid"]
    capabilities: Mapping[CapabilityKind, Capability]
    ref: RuleRef
    span: Span
    limits: Limits | None = None
    condition: CompiledCondition | None = None
    mandatory: bool = False

    @property
    def kinds(self) -> tuple[CapabilityKind, ...]:
        return tuple(self.capabilities)


@dataclass(frozen=True, slots=True)
class ConsentRule:
    """``require consent when <cel>``: calls for which a valid consent must be present."""

    ref: RuleRef
    span: Span
    condition: CompiledCondition | None
    """``None`` = the built-in rule: High safety, or Write/Process side effects (seed 000 §6)."""


@dataclass(frozen=True, slots=True)
class NamedProfile:
    """A named profile (seed 004): a preset that may only narrow the meet.

    :param fs_mode: ``read-only`` drops every fs.write capability; ``read-write`` keeps them.
    :param writable: if set, fs.write is further limited to these path globs.
    :param isolation: the backend must provide this isolation (`isolation gvisor`); a backend
        that cannot is refused, in strict and compat mode alike.
    """

    name: str
    span: Span
    network: NetworkMode | None = None
    fs_mode: Literal["read-only", "read-write"] | None = None
    writable: tuple[str, ...] | None = None
    limits: Limits = field(default_factory=Limits)
    isolation: Isolation | None = None


@dataclass(frozen=True, slots=True)
class PolicySet:
    """An org policy compiled from one or more ``.sbpolicy`` files (imports included).

    :param version_hash: SHA-256 over the canonical compiled form; part of every profile hash.
    :param home: what ``~`` expanded to in path globs.
    """

    name: str
    version: str
    version_hash: str
    files: tuple[str, ...]
    defaults: Limits
    network: NetworkMode
    rules: tuple[CompiledRule, ...]
    permits_by_kind: Mapping[CapabilityKind, tuple[CompiledRule, ...]]
    forbids_by_kind: Mapping[CapabilityKind, tuple[CompiledRule, ...]]
    consent_rules: tuple[ConsentRule, ...]
    profiles: Mapping[str, NamedProfile]
    tools: Mapping[str, Manifest]
    home: str
