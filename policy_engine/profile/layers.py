"""The layered chain (seed 002): built-in ← policy (defaults, rule) ← settings ← manifest ← grant
← named profiles ← overrides.

Built-in defaults are only defaults: the policy's own values replace them. Every later layer may
only narrow. Manifest, grant and named profiles asking for more are clipped (a manifest cannot
know the org policy; ``explain`` shows which layer set each limit); ``settings`` and request
``overrides`` are explicit operator/caller intent, so a widening value there is refused with an
error naming the field rather than quietly ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import LIMIT_FIELDS, SYSTEM_DEFAULT_LIMITS, Limits, NetworkMode


class LimitsLayer(NamedTuple):
    """One narrowing layer of limits; ``strict`` layers raise instead of clipping a widening
    value. ``layer`` is its ``LIMIT_LAYERS`` token (``name`` is what an error message shows)."""

    name: str
    limits: Limits
    strict: bool = False
    layer: str = ""


Setting = tuple[int | float, str]  # a value and the LIMIT_LAYERS token of the layer that set it


@dataclass(frozen=True, slots=True)
class LimitResolution:
    """Where every limit of a profile comes from.

    :attr base: per field, the policy's own value: its ``defaults`` when they set the field,
        else the built-in default (``SYSTEM_DEFAULT_LIMITS``).
    :attr caps: per field, the narrowest value the narrowing layers (settings, manifest, grant,
        named profiles, override) set, if any set one.
    """

    base: dict[str, Setting]
    caps: dict[str, Setting]

    def effective(self, rule: Limits | None = None) -> tuple[Limits, dict[str, str]]:
        """The limits of a call permitted by a rule with ``rule`` limits, and their layers.

        A rule's value meets the policy default (minimum) but replaces a built-in one: a
        built-in is only a default, so `permit ... limits { timeout 5m }` runs for 5 minutes
        when the policy sets no default timeout. The narrowing layers then take the minimum.
        A layer counts as having set a value only when it is strictly narrower (ties keep the
        lower layer), so ``limit_layers`` names the layer one would have to change.
        """
        values: dict[str, int | float] = {}
        layers: dict[str, str] = {}
        for field in LIMIT_FIELDS:
            value, layer = self.base[field]
            wanted = getattr(rule, field) if rule is not None else None
            if wanted is not None and (layer == "built-in" or wanted < value):
                value, layer = wanted, "rule"
            cap = self.caps.get(field)
            if cap is not None and cap[0] < value:
                value, layer = cap
            values[field], layers[field] = value, layer
        return Limits(**values), layers


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


def resolve_limits(policy: Limits, layers: Sequence[LimitsLayer],
                   builtin: Limits = SYSTEM_DEFAULT_LIMITS) -> LimitResolution:
    """Resolve the policy's ``defaults`` over the built-ins, then the narrowing ``layers``.

    The policy's value replaces the built-in one (higher or lower); each narrowing layer may
    only narrow: a non-strict layer asking for more than the value so far is clipped (a
    manifest cannot know the org policy), a strict one raises.

    :raises PolicyEngineError: ``PERMISSION_DENY`` when a strict layer would widen a field.
    """
    base: dict[str, Setting] = {}
    current: dict[str, int | float] = {}
    for field in LIMIT_FIELDS:
        own, fallback = getattr(policy, field), getattr(builtin, field)
        assert fallback is not None  # INVARIANT: the built-in layer fills every field
        base[field] = (own, "policy default") if own is not None else (fallback, "built-in")
        current[field] = base[field][0]
    caps: dict[str, Setting] = {}
    for layer in layers:
        for field in LIMIT_FIELDS:
            wanted = getattr(layer.limits, field)
            if wanted is None:
                continue
            if wanted > current[field]:
                if layer.strict:
                    raise _widen(layer.name, f"limits.{field}", current[field], wanted)
                # clipped here; kept as a cap, so a rule that raises a built-in is still bounded
            else:
                current[field] = wanted
            cap = caps.get(field)
            if cap is None or wanted < cap[0]:
                caps[field] = (wanted, layer.layer or layer.name)
    return LimitResolution(base, caps)


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
