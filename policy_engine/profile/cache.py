"""Two-level, thread-safe cache of built profiles: by input identity, then by input content.

The identity level answers repeated builds with the very same objects in well under 2 µs (a tuple
of ``id``s and one dict lookup). Its entries hold strong references to the inputs so an ``id``
cannot be reused by another object while the entry lives. The content level (a SHA-256 of the
inputs' canonical JSON) makes equal inputs share one :class:`Profile` object.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from policy_engine.model import Grant, Manifest, Overrides, Profile, Settings

IdentityKey = tuple[int, int, int, int]


class _IdentityEntry(NamedTuple):
    # the strong references are the point: they pin the ids in the key
    grant: Grant
    manifest: Manifest
    settings: Settings | None
    overrides: Overrides | None
    profile: Profile


class ProfileCache:
    """Bounded LRU maps ``identity key → profile`` and ``fingerprint → profile``."""

    def __init__(self, identity_size: int = 4096, content_size: int = 4096) -> None:
        self._lock = threading.Lock()
        self._by_identity: OrderedDict[IdentityKey, _IdentityEntry] = OrderedDict()
        self._by_content: OrderedDict[str, Profile] = OrderedDict()
        self._identity_size = identity_size
        self._content_size = content_size

    @staticmethod
    def identity_key(
        grant: Grant, manifest: Manifest, settings: Settings | None, overrides: Overrides | None
    ) -> IdentityKey:
        return (id(grant), id(manifest), id(settings), id(overrides))

    def by_identity(self, key: IdentityKey) -> Profile | None:
        with self._lock:
            entry = self._by_identity.get(key)
            if entry is None:
                return None
            self._by_identity.move_to_end(key)
            return entry.profile

    def by_content(self, fingerprint: str) -> Profile | None:
        with self._lock:
            profile = self._by_content.get(fingerprint)
            if profile is not None:
                self._by_content.move_to_end(fingerprint)
            return profile

    def store(
        self, key: IdentityKey, fingerprint: str, profile: Profile, grant: Grant,
        manifest: Manifest, settings: Settings | None, overrides: Overrides | None,
    ) -> Profile:
        """Record a build; returns the profile to use (an equal one stored first wins)."""
        with self._lock:
            # two threads may build the same inputs at once; both must get one object
            existing = self._by_content.get(fingerprint)
            if existing is None:
                self._by_content[fingerprint] = profile
                if len(self._by_content) > self._content_size:
                    self._by_content.popitem(last=False)
            else:
                profile = existing
            self._by_identity[key] = _IdentityEntry(grant, manifest, settings, overrides, profile)
            self._by_identity.move_to_end(key)
            if len(self._by_identity) > self._identity_size:
                self._by_identity.popitem(last=False)
            return profile

    def remember_identity(
        self, key: IdentityKey, profile: Profile, grant: Grant, manifest: Manifest,
        settings: Settings | None, overrides: Overrides | None,
    ) -> None:
        with self._lock:
            self._by_identity[key] = _IdentityEntry(grant, manifest, settings, overrides, profile)
            if len(self._by_identity) > self._identity_size:
                self._by_identity.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._by_identity.clear()
            self._by_content.clear()

    def __len__(self) -> int:
        return len(self._by_content)
