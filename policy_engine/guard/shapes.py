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


def shape_key(profile: Profile) -> tuple[int, ...]:
    """Identity of every non-call field (the entry pins the objects, so no id is reused)."""
    return tuple(map(id, _shape_values(profile.__dict__)))


def grantless_views(base: CompiledProfile) -> dict[str, object] | None:
    """``base``'s views without ``grant`` when no condition reads it, else ``None``."""
    if base.needs is not None and "grant" not in base.needs:
        return {k: v for k, v in base.views.items() if k != "grant"}
    return None


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
    return CompiledProfile(
        profile=profile, profile_hash=profile.profile_hash, expires_at=profile.expires_at,
        network_off=base.network_off, consent_required=base.consent_required,
        consent_window=(consent.granted_at, consent.expires_at) if consent is not None else None,
        root_fs=base.root_fs, tmp_dir=base.tmp_dir, caps=base.caps, forbids=base.forbids,
        granted=base.granted, declared=base.declared, views=views, needs=base.needs,
        context_views=context_views, permit_index=base.permit_index)


class ShapeCache:
    """Bounded LRU of compilations by shape, and of compiled forbids by deny set."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._shapes: OrderedDict[tuple[int, ...],
                                  tuple[CompiledProfile, dict[str, object] | None]] = OrderedDict()
        self._forbids: OrderedDict[tuple[object, ...], tuple[object, Mapping[str, ForbidSet]]] = \
            OrderedDict()

    def compiled(self, profile: Profile,
                 compile_: Callable[[Profile], CompiledProfile]) -> CompiledProfile:
        """The compilation of ``profile``, from a profile of the same shape when there is one."""
        key = shape_key(profile)
        with self._lock:
            hit = self._shapes.get(key)
            if hit is not None:
                self._shapes.move_to_end(key)
        if hit is not None:
            return derive(hit[0], profile, hit[1])
        cp = compile_(profile)  # its ``profile`` pins every object whose id is in the key
        with self._lock:
            self._shapes[key] = (cp, grantless_views(cp))
            while len(self._shapes) > self._size:
                self._shapes.popitem(last=False)
        return cp

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
