"""Bounded, thread-safe LRU cache of built profiles: by input identity, content, and shape.

Three levels, tried in order by ``ProfileBuilder.build``:

- identity: the very same input objects again, in well under 2 µs (a tuple of ``id``s and one
  dict lookup). Entries hold weak references to the inputs and a hit checks they are the same
  objects, so an ``id`` reused by another object never matches and no grant is kept alive;
- content: equal inputs (their exact JSON) share one :class:`Profile` object;
- shape: inputs equal but for the grant's per-call fields (``shape.PER_CALL_FIELDS``: call id,
  expiry, consent, budget) share one template, and the call's profile is a copy of it with its
  own fields and hash (``shape.ProfileShape``), so a new grant per call skips the meet.

Every level is an LRU bounded by ``size`` entries (the shape level by ``shape_size``), so a
long-running engine holds at most that many profiles whatever its callers send.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import NamedTuple, TypeVar

from pydantic import BaseModel

from policy_engine.model import Grant, Manifest, Overrides, Profile, Settings
from policy_engine.profile.shape import ProfileShape, model_key

IdentityKey = tuple[int, int, int, int]
ShapeKey = tuple[bytes, str, str, str]
"""Exact JSON of the grant without its call fields, the manifest, the settings, the overrides."""
ContentKey = tuple[ShapeKey, tuple[str, ...]]
"""The shape key and the canonical JSON of the grant's call fields (``shape.call_values``)."""

DEFAULT_SIZE = 4096
DEFAULT_SHAPE_SIZE = 1024

_K = TypeVar("_K")
_V = TypeVar("_V")


class _IdentityEntry(NamedTuple):
    # weak references: an entry must not keep a caller's per-call grant alive, and a hit
    # checks each is still the very object (an id reused by a new object never matches)
    grant: weakref.ref[Grant]
    manifest: weakref.ref[Manifest]
    settings: weakref.ref[Settings] | None
    overrides: weakref.ref[Overrides] | None
    profile: Profile

    @staticmethod
    def of(grant: Grant, manifest: Manifest, settings: Settings | None,
           overrides: Overrides | None, profile: Profile) -> _IdentityEntry:
        return _IdentityEntry(weakref.ref(grant), weakref.ref(manifest),
                              None if settings is None else weakref.ref(settings),
                              None if overrides is None else weakref.ref(overrides), profile)

    def holds(self, grant: Grant, manifest: Manifest, settings: Settings | None,
              overrides: Overrides | None) -> bool:
        return (self.grant() is grant and self.manifest() is manifest
                and (settings is None if self.settings is None else self.settings() is settings)
                and (overrides is None if self.overrides is None
                     else self.overrides() is overrides))


def _put(lru: OrderedDict[_K, _V], key: _K, value: _V, size: int) -> None:
    lru[key] = value
    lru.move_to_end(key)
    while len(lru) > size:
        lru.popitem(last=False)


class ProfileCache:
    """Bounded LRU maps ``identity → profile``, ``content → profile`` and ``shape → template``.

    :param size: profiles kept per level (identity and content); the least recently used goes.
    :param shape_size: templates kept (one per distinct grant shape × manifest × layers).
    :param identity_size, content_size: override ``size`` for one level (0 turns it off).
    """

    def __init__(self, size: int = DEFAULT_SIZE, shape_size: int = DEFAULT_SHAPE_SIZE, *,
                 identity_size: int | None = None, content_size: int | None = None) -> None:
        if min(size, shape_size) < 1:
            raise ValueError("profile cache sizes must be at least 1")
        self._lock = threading.Lock()
        self._by_identity: OrderedDict[IdentityKey, _IdentityEntry] = OrderedDict()
        self._by_content: OrderedDict[ContentKey, Profile] = OrderedDict()
        self._shapes: OrderedDict[ShapeKey, ProfileShape] = OrderedDict()
        # input JSON by identity (manifests and settings are reused call after call); the
        # object is kept with its JSON so its id cannot be reused while the entry lives
        self._inputs: OrderedDict[int, tuple[BaseModel, str]] = OrderedDict()
        # an explicit 0 turns a level off (benchmarks time the content level alone that way)
        self._identity_size = size if identity_size is None else identity_size
        self._content_size = size if content_size is None else content_size
        self._shape_size = shape_size
        self._input_size = shape_size

    @staticmethod
    def identity_key(
        grant: Grant, manifest: Manifest, settings: Settings | None, overrides: Overrides | None
    ) -> IdentityKey:
        return (id(grant), id(manifest), id(settings), id(overrides))

    def input_key(self, model: BaseModel | None) -> str:
        """Exact JSON of a manifest, settings or overrides object, remembered by identity."""
        if model is None:
            return "null"
        with self._lock:
            entry = self._inputs.get(id(model))
            if entry is not None and entry[0] is model:
                return entry[1]
        text = model_key(model)
        with self._lock:
            _put(self._inputs, id(model), (model, text), self._input_size)
        return text

    def by_identity(self, key: IdentityKey, grant: Grant, manifest: Manifest,
                    settings: Settings | None, overrides: Overrides | None) -> Profile | None:
        with self._lock:
            entry = self._by_identity.get(key)
            if entry is None or not entry.holds(grant, manifest, settings, overrides):
                return None
            self._by_identity.move_to_end(key)
            return entry.profile

    def by_content(self, key: ContentKey) -> Profile | None:
        with self._lock:
            profile = self._by_content.get(key)
            if profile is not None:
                self._by_content.move_to_end(key)
            return profile

    def by_shape(self, key: ShapeKey) -> ProfileShape | None:
        with self._lock:
            shape = self._shapes.get(key)
            if shape is not None:
                self._shapes.move_to_end(key)
            return shape

    def store_shape(self, key: ShapeKey, shape: ProfileShape) -> ProfileShape:
        """Record a template; returns the one to use (one stored first wins)."""
        with self._lock:
            existing = self._shapes.get(key)
            if existing is not None:
                return existing
            shape.key = key
            _put(self._shapes, key, shape, self._shape_size)
            return shape

    def store(
        self, key: IdentityKey, content: ContentKey, profile: Profile, grant: Grant,
        manifest: Manifest, settings: Settings | None, overrides: Overrides | None,
    ) -> Profile:
        """Record a build; returns the profile to use (an equal one stored first wins)."""
        with self._lock:
            # two threads may build the same inputs at once; both must get one object
            existing = self._by_content.get(content)
            if existing is None:
                _put(self._by_content, content, profile, self._content_size)
            else:
                profile = existing
            _put(self._by_identity, key,
                 _IdentityEntry.of(grant, manifest, settings, overrides, profile),
                 self._identity_size)
            return profile

    def remember_identity(
        self, key: IdentityKey, profile: Profile, grant: Grant, manifest: Manifest,
        settings: Settings | None, overrides: Overrides | None,
    ) -> None:
        with self._lock:
            _put(self._by_identity, key,
                 _IdentityEntry.of(grant, manifest, settings, overrides, profile),
                 self._identity_size)

    def clear(self) -> None:
        with self._lock:
            self._by_identity.clear()
            self._by_content.clear()
            self._shapes.clear()
            self._inputs.clear()

    def __len__(self) -> int:
        return len(self._by_content)

    def stats(self) -> dict[str, int]:
        """Entries per level (for operators and tests)."""
        with self._lock:
            return {"identity": len(self._by_identity), "content": len(self._by_content),
                    "shapes": len(self._shapes)}
