"""Bounded, thread-safe LRU cache of built profiles: by input identity, and by grant shape.

Two levels, tried in order by ``ProfileBuilder.build``:

- identity: the very same input objects again, in about a microsecond (one dict lookup by the
  grant's ``id``). An entry holds a weak reference to the grant and a hit checks every input is
  the same object, so an ``id`` reused by another grant never matches and no grant is kept
  alive;
- call: equal inputs in other objects (a service parses each request's grant anew): the exact
  JSON of the whole grant (SHA-256 of it, call fields included) with the other inputs' exact
  JSON finds the profile an equal grant got, the very object, so the guard's compiled profile
  is found by identity too. Only grants whose call fields are of their validated types take
  this level (a grant built without validation goes through the copy, which validates them);
- shape: inputs equal but for the grant's per-call fields (``shape.PER_CALL_FIELDS``: call id,
  expiry, consent, budget) share one template, compared as exact JSON, and the call's profile
  is a copy of it with its own fields and hash (``shape.ProfileShape``), so a new grant per call
  skips the meet.

Equal inputs in other objects therefore get equal profiles (same fields, same hash), the same
object while the call level holds it.

All levels are LRUs bounded by ``size`` entries (the shape level by ``shape_size``), so a
long-running engine holds at most that many profiles whatever its callers send.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from typing import TypeVar

from pydantic import BaseModel

from policy_engine.model import Budget, Consent, Grant, Manifest, Overrides, Profile, Settings
from policy_engine.model.grant_json import grant_json
from policy_engine.profile.shape import ProfileShape, model_key

ShapeKey = tuple[bytes, str, str, str]
"""Exact JSON of the grant without its call fields, the manifest, the settings, the overrides."""

CallKey = tuple[bytes, str, str, str]
"""The whole grant's exact JSON without its `null` members (``#`` and its SHA-256 when over
``_KEPT_KEY`` bytes), then the manifest, settings and overrides JSON."""
_KEPT_KEY = 512

DEFAULT_SIZE = 4096
DEFAULT_SHAPE_SIZE = 1024

_K = TypeVar("_K")
_V = TypeVar("_V")

_IdentityEntry = tuple["weakref.ref[Grant]", Manifest, "Settings | None", "Overrides | None",
                       Profile]
"""The grant (weakly: an entry must not keep a caller's per-call grant alive), the other inputs
(long-lived, held so their ids stay theirs) and the profile built from them."""


def _put(lru: OrderedDict[_K, _V], key: _K, value: _V, size: int) -> None:
    lru[key] = value
    lru.move_to_end(key)
    if len(lru) > size:
        lru.popitem(last=False)


class ProfileCache:
    """Bounded LRU maps ``identity → profile`` and ``shape → template``.

    :param size: profiles kept by the identity level; the least recently used goes.
    :param shape_size: templates kept (one per distinct grant shape × manifest × layers).
    :param identity_size: overrides ``size`` (0 turns the identity level off: benchmarks time
        the shape level alone that way).
    """

    def __init__(self, size: int = DEFAULT_SIZE, shape_size: int = DEFAULT_SHAPE_SIZE, *,
                 identity_size: int | None = None) -> None:
        if min(size, shape_size) < 1:
            raise ValueError("profile cache sizes must be at least 1")
        if identity_size is not None and identity_size < 0:
            raise ValueError("the identity level's size must be 0 (off) or more")
        # the policy set whose profiles this cache holds: its keys leave the policy out, so one
        # cache serves one policy set (``serve``)
        self._policy: object | None = None
        self._lock = threading.Lock()
        self._by_identity: OrderedDict[int, _IdentityEntry] = OrderedDict()
        self._shapes: OrderedDict[ShapeKey, ProfileShape] = OrderedDict()
        self._by_call: OrderedDict[CallKey, Profile] = OrderedDict()
        # input JSON by identity (manifests and settings are reused call after call); the
        # object is kept with its JSON so its id cannot be reused while the entry lives
        self._inputs: OrderedDict[int, tuple[BaseModel, str]] = OrderedDict()
        self._identity_size = size if identity_size is None else identity_size
        self._shape_size = shape_size
        self._input_size = shape_size

    def serve(self, policyset: object) -> None:
        """Bind this cache to ``policyset`` (its builder's); a second policy set is refused:
        entries are keyed by the inputs alone, so another policy's builder would get them."""
        with self._lock:
            if self._policy is None:
                self._policy = policyset
            elif self._policy is not policyset:
                raise ValueError("this ProfileCache already holds another policy set's profiles: "
                                 "give each ProfileBuilder its own cache")

    def input_key(self, model: BaseModel | None) -> str:
        """Exact JSON of a manifest, settings or overrides object, remembered by identity."""
        if model is None:
            return "null"
        entry = self._inputs.get(id(model))  # a dict read is atomic; the check makes it exact
        if entry is not None and entry[0] is model:
            return entry[1]
        text = model_key(model)
        with self._lock:
            _put(self._inputs, id(model), (model, text), self._input_size)
        return text

    def by_identity(self, grant: Grant, manifest: Manifest, settings: Settings | None,
                    overrides: Overrides | None) -> Profile | None:
        """The profile built from these very objects, if it is still cached."""
        entry = self._by_identity.get(id(grant))
        if entry is None or entry[0]() is not grant or entry[1] is not manifest \
                or entry[2] is not settings or entry[3] is not overrides:
            return None
        try:  # noqa: SIM105 - see ``remember``
            self._by_identity.move_to_end(id(grant))
        except KeyError:
            pass
        return entry[4]

    def remember(self, grant: Grant, manifest: Manifest, settings: Settings | None,
                 overrides: Overrides | None, profile: Profile) -> None:
        """Record the profile built from these objects (for ``by_identity``)."""
        if not self._identity_size:
            return
        entry = (weakref.ref(grant), manifest, settings, overrides, profile)
        lru, key = self._by_identity, id(grant)
        # no lock: each OrderedDict call is atomic under the GIL (int keys); two threads racing
        # here at worst drop one entry too many or skip a move
        lru[key] = entry
        try:  # noqa: SIM105 - contextlib.suppress costs more than this whole method
            lru.move_to_end(key)
            if len(lru) > self._identity_size:
                lru.popitem(last=False)
        except KeyError:
            pass

    def call_key(self, grant: Grant, inputs: tuple[str, str, str]) -> CallKey | None:
        """The call level's key of ``grant`` with the other inputs' JSON (``input_key``), or
        ``None`` when the level is off or a call field is not of its validated type."""
        if not self._identity_size:
            return None
        g = grant.__dict__
        consent = g["consent"]
        if type(g["call_id"]) is not str or type(g["expires_at"]) is not int or \
                type(g["budget"]) is not Budget or not (consent is None or
                                                        type(consent) is Consent):
            return None
        # the JSON without its `null` members: a grant holds no dict (models, tuples, scalars
        # only), so a member left out can only be a field that is None, and the text is as
        # exact as the whole one at a third of its size (the limits and budget are mostly
        # unset); kept as is when short (a hash costs more than the dict's own), else hashed
        # (`#` never begins a JSON object)
        exact = grant_json(grant)  # kept: the replay block shows the grant from it
        if len(exact) > _KEPT_KEY:
            exact = b"#" + hashlib.sha256(exact).digest()
        return (exact, *inputs)

    def by_call(self, key: CallKey) -> Profile | None:
        """The profile an equal grant with equal inputs got, if it is still cached."""
        calls = self._by_call
        profile = calls.get(key)
        if profile is not None:
            try:  # noqa: SIM105 - see ``remember``
                calls.move_to_end(key)
            except KeyError:
                pass
        return profile

    def remember_call(self, key: CallKey, profile: Profile) -> None:
        """Record the profile built for ``key`` (for ``by_call``)."""
        lru = self._by_call
        lru[key] = profile  # atomic under the GIL (bytes and str keys), as in ``remember``
        try:  # noqa: SIM105 - see ``remember``
            lru.move_to_end(key)
            if len(lru) > self._identity_size:
                lru.popitem(last=False)
        except KeyError:
            pass

    def by_shape(self, key: ShapeKey) -> ProfileShape | None:
        # no lock on the hit path: each OrderedDict call is atomic under the GIL (keys are
        # bytes and str tuples: no Python code runs inside), and a key evicted between the two
        # calls only skips the LRU move
        shapes = self._shapes
        shape = shapes.get(key)
        if shape is not None:
            try:  # noqa: SIM105 - contextlib.suppress costs ≈ 0.3 µs more, on every new grant
                shapes.move_to_end(key)
            except KeyError:
                pass
        return shape

    def store_shape(self, key: ShapeKey, shape: ProfileShape) -> ProfileShape:
        """Record a template; returns the one to use (one stored first wins)."""
        with self._lock:
            existing = self._shapes.get(key)
            if existing is not None:
                return existing
            _put(self._shapes, key, shape, self._shape_size)
            return shape

    def clear(self) -> None:
        with self._lock:
            self._by_identity.clear()
            self._by_call.clear()
            self._shapes.clear()
            self._inputs.clear()

    def __len__(self) -> int:
        return len(self._by_identity)

    def stats(self) -> dict[str, int]:
        """Entries per level (for operators and tests)."""
        with self._lock:
            return {"identity": len(self._by_identity), "calls": len(self._by_call),
                    "shapes": len(self._shapes)}
