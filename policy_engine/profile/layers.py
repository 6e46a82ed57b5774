"""The layered chain (seed 002): system default ← policy ← settings ← manifest ← grant ← overrides.

Every layer may only narrow. Policy, manifest, grant and named profiles asking for more than the
layer below are clipped silently (a manifest cannot know the org policy); ``settings`` and request
``overrides`` are explicit operator/caller intent, so a widening value there is refused with an
error naming the field rather than quietly ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import LIMIT_FIELDS, SYSTEM_DEFAULT_LIMITS, Limits, NetworkMode


class LimitsLayer(NamedTuple):
    """One layer of limits; ``strict`` layers raise instead of clipping a widening value."""

    name: str
    limits: Limits
    strict: bool = False


class NetworkLayer(NamedTuple):
    name: str
    network: NetworkMode | None
    strict: bool = False


def _widen(layer: str, field: str, current: object, wanted: object) -> PolicyEngineError:
    return PolicyEngineError(
        ErrorCode.PERMISSION_DENY,
        f"{layer} would widen `{field}` from {current} to {wanted}",
        audit={"layer": layer, "field": field, "current": current, "wanted": wanted},
    )


def resolve_limits(layers: Sequence[LimitsLayer], base: Limits = SYSTEM_DEFAULT_LIMITS) -> Limits:
    """Fold ``layers`` over ``base`` (which must be concrete) keeping the minimum of each field.

    :raises PolicyEngineError: ``PERMISSION_DENY`` when a strict layer would widen a field.
    """
    current: dict[str, int | float] = {}
    for field in LIMIT_FIELDS:
        value = getattr(base, field)
        assert value is not None  # INVARIANT: the base layer fills every field
        current[field] = value
    for layer in layers:
        for field in LIMIT_FIELDS:
            wanted = getattr(layer.limits, field)
            if wanted is None:
                continue
            if wanted > current[field]:
                if layer.strict:
                    raise _widen(layer.name, f"limits.{field}", current[field], wanted)
                continue
            current[field] = wanted
    return Limits(**current)


def call_network(policy_default: NetworkMode, manifest_wants: NetworkMode | None) -> NetworkMode:
    """The network mode a call starts from, before settings, named profiles and overrides.

    The policy's default applies unless the manifest asks for a mode. A manifest may ask for
    network, but unrestricted network (``on``: a sandboxed process reaches anything, bypassing
    the per-request rules) needs the policy itself to default to ``on``; otherwise the most a
    manifest gets is ``restricted`` (every request goes through the rules, via the proxy).
    """
    if manifest_wants is None:
        return policy_default
    ceiling = NetworkMode.ON if policy_default is NetworkMode.ON else NetworkMode.RESTRICTED
    return manifest_wants if manifest_wants.rank <= ceiling.rank else ceiling


def resolve_network(base: NetworkMode, layers: Sequence[NetworkLayer]) -> NetworkMode:
    """Fold ``layers`` over ``base`` keeping the lowest rank (off < restricted < on).

    :raises PolicyEngineError: ``PERMISSION_DENY`` when a strict layer asks for a higher mode.
    """
    current = base
    for layer in layers:
        wanted = layer.network
        if wanted is None:
            continue
        if wanted.rank > current.rank:
            if layer.strict:
                raise _widen(layer.name, "network", current.value, wanted.value)
            continue
        current = wanted
    return current


def meet_limits(a: Limits, b: Limits | None) -> Limits:
    """Field-wise minimum of the values set (``None`` = unconstrained by that source)."""
    if b is None:
        return a
    out: dict[str, int | float | None] = {}
    for field in LIMIT_FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        out[field] = y if x is None else (x if y is None else min(x, y))
    return Limits(**out)
