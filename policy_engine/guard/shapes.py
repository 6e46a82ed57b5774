"""Compiled profiles shared by shape: per-call profiles of one grant shape compile once.

The profile builder stamps each call's profile out of a cached template (``profile.shape``):
only ``call_id``, ``expires_at``, ``consent``, ``budget`` and ``profile_hash`` differ, and every
other field is the template's very object. A profile whose other fields are those same objects
(compared by identity, so a hand-built profile that merely looks alike compiles on its own) reuses
the template's compilation with its own call fields put back: expiry, consent window, the
``grant`` view conditions read, and the hash (the guard stamps it on the allow it returns).

The forbids of a profile come from the policy alone, so they are compiled once per deny set and
shared by every profile of the policy, whatever its grant.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from policy_engine.guard.compiled import CompiledProfile, ForbidSet, view_items
from policy_engine.model import Profile

PER_CALL_FIELDS = frozenset({"budget", "call_id", "consent", "expires_at", "profile_hash"})
"""Fields a compilation does not depend on beyond what ``derive`` puts back."""
SHAPE_FIELDS: tuple[str, ...] = tuple(f for f in Profile.model_fields if f not in PER_CALL_FIELDS)
_shape_values = operator.itemgetter(*SHAPE_FIELDS)


_all_values = operator.itemgetter(*Profile.model_fields)


def same_profile(a: Profile, b: Profile) -> bool:
    """Whether ``b`` holds what ``a`` holds, field by field (the very same object, else equal):
    profiles of one grant built twice share every shape field's object and have equal call
    fields, so the check is a pass of identity tests; a lookalike differs somewhere."""
    for x, y in zip(_all_values(a.__dict__), _all_values(b.__dict__), strict=True):
        if x is not y and x != y:
            return False
    return True


def grantless_views(base: CompiledProfile) -> dict[str, object] | None:
    """``base``'s views without ``grant`` when no condition reads it, else ``None``."""
    if base.needs is not None and "grant" not in base.needs:
        return {k: v for k, v in base.views.items() if k != "grant"}
    return None


def _reads_no_call_field(base: CompiledProfile) -> bool:
    """Whether no condition of ``base`` reads a call field of ``grant``: then a call of its
    shape is decided on ``base`` itself with the call's expiry, consent window and hash."""
    if base.needs is not None and "grant" not in base.needs:
        return True
    view = base.views.get("grant")
    return isinstance(view, Mapping) and not any(f in view for f in _GRANT_CALL_VIEW)


_GRANT_CALL_VIEW = ("call_id", "expires_at", "budget", "consent")
"""The ``grant`` view's fields that differ call by call (``_call_fields``)."""


def _call_fields(profile: Profile, view: Mapping[str, object]) -> dict[str, object]:
    """This call's values of the grant view's call fields that ``view`` holds (the view may be
    cut down to what conditions read: ``guard.viewfields``)."""
    out: dict[str, object] = {}
    if "call_id" in view:
        out["call_id"] = profile.call_id
    if "expires_at" in view:
        out["expires_at"] = profile.expires_at
    if "budget" in view:
        out["budget"] = profile.budget.model_dump(mode="json")
    if "consent" in view:
        consent = profile.consent
        out["consent"] = consent.model_dump(mode="json") if consent is not None else None
    return out


def derive(base: CompiledProfile, profile: Profile,
           grantless: dict[str, object] | None = None) -> CompiledProfile:
    """``base`` (compiled for a profile of the same shape) with ``profile``'s call fields.

    :param grantless: ``grantless_views(base)``, shared by every call of the shape.
    """
    consent = profile.consent
    views: Mapping[str, object]
    # the context's views are the base's unless this call's grant view differs from them
    context_views = base.context_views
    if base.needs is not None and "grant" not in base.needs:
        # no condition reads ``grant``, so the context never holds it: leave the view out
        # rather than carry another call's
        views = grantless if grantless is not None else grantless_views(base) or {}
    else:
        grant_view = base.views["grant"]
        assert isinstance(grant_view, Mapping)  # INVARIANT: static_views builds a dict
        own = _call_fields(profile, grant_view)
        if own:
            views = dict(base.views)
            views["grant"] = {**grant_view, **own}
            context_views = view_items(views, base.needs)
        else:  # conditions read no call field of the grant (guard.viewfields)
            views = base.views
    return _with_call_fields(
        base, profile, profile.profile_hash, profile.expires_at,
        (consent.granted_at, consent.expires_at) if consent is not None else None,
        views, context_views)


# A per-call copy is built slot by slot: the frozen dataclass's ``__init__`` sets each of its 19
# fields through ``object.__setattr__`` (≈ 2 µs, on every new grant); the slots' own setters take
# ≈ 0.8 µs. The import-time check below keeps this list equal to the dataclass's fields.
_NEW_CP = object.__new__
_SLOT = {name: getattr(CompiledProfile, name).__set__ for name in CompiledProfile.__slots__}
(_s_profile, _s_profile_hash, _s_expires_at, _s_network_off, _s_consent_required,
 _s_consent_window, _s_root_fs, _s_tmp_dir, _s_caps, _s_forbids, _s_granted, _s_declared,
 _s_views, _s_needs, _s_context_views, _s_permit_index, _s_consent_settled, _s_plans,
 _s_refusals) = (
    _SLOT[f.name] for f in dataclasses.fields(CompiledProfile))
if [f.name for f in dataclasses.fields(CompiledProfile)] != [
        "profile", "profile_hash", "expires_at", "network_off", "consent_required",
        "consent_window", "root_fs", "tmp_dir", "caps", "forbids", "granted", "declared",
        "views", "needs", "context_views", "permit_index",
        "consent_settled", "plans", "refusals"]:  # pragma: no cover - a code change
    raise ImportError("CompiledProfile's fields changed: update shapes._with_call_fields")


def _with_call_fields(base: CompiledProfile, profile: Profile, profile_hash: str,
                      expires_at: int, consent_window: tuple[int, int] | None,
                      views: Mapping[str, object],
                      context_views: tuple[tuple[str, object], ...]) -> CompiledProfile:
    """``base`` with another call's fields: what ``CompiledProfile(...)`` would build."""
    cp: CompiledProfile = _NEW_CP(CompiledProfile)
    _s_profile(cp, profile)
    _s_profile_hash(cp, profile_hash)
    _s_expires_at(cp, expires_at)
    _s_network_off(cp, base.network_off)
    _s_consent_required(cp, base.consent_required)
    _s_consent_window(cp, consent_window)
    _s_root_fs(cp, base.root_fs)
    _s_tmp_dir(cp, base.tmp_dir)
    _s_caps(cp, base.caps)
    _s_forbids(cp, base.forbids)
    _s_granted(cp, base.granted)
    _s_declared(cp, base.declared)
    _s_views(cp, views)
    _s_needs(cp, base.needs)
    _s_context_views(cp, context_views)
    _s_permit_index(cp, base.permit_index)
    _s_consent_settled(cp, base.consent_settled)
    _s_plans(cp, base.plans)  # the same forbids, network and consent: the same plans
    _s_refusals(cp, base.refusals)  # the same caps, granted and declared: the same refusals
    return cp


class ShapeCache:
    """Bounded LRU of compilations by shape, and of compiled forbids by deny set."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._size = size
        # id of the shape's ``mappings`` → its compilation, the views without ``grant``, every
        # shape field's object (``SHAPE_FIELDS`` order), and whether no condition reads a call
        # field of ``grant`` (``base_for``)
        self._shapes: OrderedDict[int, tuple[CompiledProfile, dict[str, object] | None,
                                             tuple[object, ...], bool]] = OrderedDict()
        self._forbids: OrderedDict[tuple[object, ...], tuple[object, Mapping[str, ForbidSet]]] = \
            OrderedDict()

    def compiled(self, profile: Profile,
                 compile_: Callable[[Profile], CompiledProfile]) -> CompiledProfile:
        """The compilation of ``profile``, from a profile of the same shape when there is one."""
        fields = profile.__dict__
        values = _shape_values(fields)
        # one int keys the entry (``mappings``: a new object per meet, so per template); the
        # entry matches only if every other field is the very same object too
        key = id(fields["mappings"])
        shapes = self._shapes
        # no lock on the hit path: each OrderedDict call is atomic under the GIL (int keys), and
        # an entry evicted between the two calls only skips the LRU move
        hit = shapes.get(key)
        if hit is not None and all(map(operator.is_, values, hit[2])):
            try:  # noqa: SIM105 - contextlib.suppress costs ≈ 0.3 µs more, on every new grant
                shapes.move_to_end(key)
            except KeyError:
                pass
            return derive(hit[0], profile, hit[1])
        cp = compile_(profile)  # its ``profile`` pins every object the entry compares
        if hit is not None:
            # a lookalike sharing the key object (a ``model_copy`` of a call's profile): it
            # compiles on its own and leaves the shape's entry to the shape's calls
            return cp
        with self._lock:
            self._shapes[key] = (cp, grantless_views(cp), values, _reads_no_call_field(cp))
            self._shapes.move_to_end(key)
            if len(self._shapes) > self._size:
                self._shapes.popitem(last=False)
        return cp

    def base_for(self, profile: Profile) -> CompiledProfile | None:
        """The compilation of ``profile``'s shape when it decides ``profile`` as it is: every
        field but the call fields (expiry, consent window, hash), which the caller reads from
        ``profile`` itself. ``None`` when no such shape is cached, or when a condition reads a
        call field of ``grant`` (then only ``compiled`` gives the right view)."""
        fields = profile.__dict__
        hit = self._shapes.get(id(fields["mappings"]))
        if hit is None or not hit[3] or not all(map(operator.is_, _shape_values(fields), hit[2])):
            return None
        return hit[0]

    def forbids(self, profile: Profile,
                compile_: Callable[[Profile], Mapping[str, ForbidSet]]) -> Mapping[str, ForbidSet]:
        """The compiled forbids of ``profile``: they depend on its denies, deny-lists and home
        alone, so profiles of one policy (the same deny objects) share them."""
        pinned: tuple[Any, ...] = (profile.denies, profile.deny, profile.mappings.home)
        key = (profile.mappings.home, id(profile.deny), *map(id, profile.denies))
        with self._lock:
            hit = self._forbids.get(key)
            if hit is not None:
                self._forbids.move_to_end(key)
                return hit[1]
        out = compile_(profile)
        with self._lock:
            self._forbids[key] = (pinned, out)
            while len(self._forbids) > self._size:
                self._forbids.popitem(last=False)
        return out
