"""Per-call profiles from a shared template: build keys without call fields, hash by splicing.

Grants are per call: ``call_id`` (and usually ``expires_at``, ``consent``, ``budget``) change on
every call while what the meet depends on (tool, subject, capabilities, limits, manifest,
settings, overrides) does not. The builder therefore caches one *template* profile per shape and
makes each call's profile a copy with the call's fields. Those fields are only copied into the
profile, never met, so the copy equals what a full build would produce
(``tests/unit/test_profile_shape.py`` checks it field by field and hash by hash).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from json.encoder import encode_basestring
from typing import Any

from pydantic import BaseModel

from policy_engine.model import Budget, Consent, Grant, Profile
from policy_engine.model.unchecked import SET_EXTRA, SET_FIELDS_SET, SET_PRIVATE
from policy_engine.profile.hashing import CALL_FIELDS, EXPLANATORY, canonical_json, sha256_hex

PER_CALL_FIELDS: tuple[str, ...] = CALL_FIELDS
"""Profile fields taken from the grant as they are, never met: the only ones a copy changes
(sorted: the order canonical JSON writes them, and ``HashTemplate.digest`` takes them)."""

_GRANT_CALL = frozenset(PER_CALL_FIELDS)
# not in the profile at all, so not part of either key
_GRANT_NOT_SHAPE: set[str] = {*_GRANT_CALL, "decision_key_fingerprint"}


def grant_shape_key(grant: Grant) -> bytes:
    """The grant's content without its per-call fields (exact JSON: ``1`` and ``1.0`` differ).

    Fields holding ``None`` are left out (≈ 15 % less to write): an absent key always means
    ``None`` whatever the field's default, so the key stays one-to-one with the content.
    """
    return grant.__pydantic_serializer__.to_json(grant, exclude=_GRANT_NOT_SHAPE,
                                                 exclude_none=True)


def model_key(model: BaseModel | None) -> str:
    """Exact JSON of a build input (``null`` for an absent layer)."""
    return "null" if model is None else model.model_dump_json()


class HashTemplate:
    """``profile_hash`` of a template's copies (``hashing.profile_hash``, two levels): the shape
    digest of everything but the per-call fields is computed once per template; a copy's hash
    reads only its call fields (a few hundred bytes, whatever the size of the policy)."""

    __slots__ = ("shape",)

    def __init__(self, template: Profile, policy_version_hash: str,
                 manifest_version: str, fixed: Mapping[str, str] | None = None) -> None:
        """:param fixed: canonical JSON of fields the caller rendered already (the policy's
            denies are the same in every profile of a builder); the rest is rendered here."""
        fixed = fixed or {}
        exclude: dict[str, Any] = {**EXPLANATORY, **dict.fromkeys(fixed, True),
                                   **dict.fromkeys(_GRANT_CALL, True), "profile_hash": True}
        body: dict[str, Any] = template.model_dump(mode="json", exclude=exclude)
        body.update(dict.fromkeys(fixed))
        # ``hashing.shape_digest``'s canonical JSON, with the fixed fields spliced in as rendered
        text = ('{"manifest_version":' + canonical_json(manifest_version)
                + ',"policy_version_hash":' + canonical_json(policy_version_hash)
                + ',"profile":{'
                + ",".join(canonical_json(name) + ":"
                           + (fixed[name] if name in fixed else canonical_json(body[name]))
                           for name in sorted(body))
                + "}}")
        self.shape = sha256_hex(text)

    def digest(self, values: tuple[str, ...]) -> str:
        """The hash of the template with ``values``: the canonical JSON of the call fields, in
        ``PER_CALL_FIELDS`` order (the sorted order canonical JSON writes)."""
        budget, call_id, consent, expires_at = values
        return hashlib.sha256("".join((
            '{"call":{"budget":', budget, ',"call_id":', call_id, ',"consent":', consent,
            ',"expires_at":', expires_at, '},"shape":"', self.shape, '"}')).encode()).hexdigest()


_CANON_SIZE = 512
_canon: dict[bytes, str] = {}


def _canonical_model(model: BaseModel | None) -> str:
    """Canonical JSON of a small model (budget, consent), remembered by its exact JSON: grants
    of one caller mostly repeat them, and ``json.dumps`` costs more than the lookup."""
    if model is None:
        return "null"
    exact = model.__pydantic_serializer__.to_json(model)
    text = _canon.get(exact)
    if text is None:
        text = canonical_json(model.model_dump(mode="json"))
        if len(_canon) >= _CANON_SIZE:  # a bound, not an LRU: a miss only costs the dump
            _canon.clear()
        _canon[exact] = text
    return text


class ProfileShape:
    """One cached template and what it takes to stamp out a call's profile from it."""

    __slots__ = ("template", "hasher", "_fields_set")

    def __init__(self, template: Profile, hasher: HashTemplate) -> None:
        self.template = template
        self.hasher = hasher
        # one set for every copy: frozen models never change it, and it is 700 bytes a copy
        self._fields_set = set(template.__pydantic_fields_set__) | _SET_FIELDS

    def instantiate(self, grant: Grant) -> Profile:
        """The template with ``grant``'s call fields and hash (the caller checked the shapes
        match)."""
        g = grant.__dict__
        budget, call_id, consent, expires_at = (g["budget"], g["call_id"], g["consent"],
                                                g["expires_at"])
        if type(call_id) is not str or type(expires_at) is not int or \
                type(budget) is not Budget or not (consent is None or type(consent) is Consent):
            # a grant that skipped validation (``model_construct``, ``model_copy(update=...)``):
            # the call fields go through the profile's validation, as a full build's do (it
            # raises the same error, or turns ``True`` into ``1``)
            checked = Profile.model_validate({**self.template.__dict__, "budget": budget,
                                              "call_id": call_id, "consent": consent,
                                              "expires_at": expires_at})
            budget, call_id, consent, expires_at = (checked.budget, checked.call_id,
                                                    checked.consent, checked.expires_at)
        # the call fields' canonical JSON, inline: this runs for every new grant
        digest = self.hasher.digest((_canonical_model(budget), encode_basestring(call_id),
                                     _canonical_model(consent), str(expires_at)))
        # ``model_copy`` without its generic path: a shallow copy of a frozen model built and
        # validated here, with validated values of the grant in the call fields
        profile = _new_profile(Profile)
        fields = self.template.__dict__.copy()
        fields["budget"] = budget
        fields["call_id"] = call_id
        fields["consent"] = consent
        fields["expires_at"] = expires_at
        fields["profile_hash"] = digest
        _set(profile, "__dict__", fields)
        SET_FIELDS_SET(profile, self._fields_set)
        SET_EXTRA(profile, None)
        SET_PRIVATE(profile, None)
        return profile


_new_profile = Profile.__new__
_set = object.__setattr__  # ``__dict__`` is no slot: the generic setter stores it
_SET_FIELDS = frozenset({*PER_CALL_FIELDS, "profile_hash"})
