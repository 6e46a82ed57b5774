"""Canonical JSON and the hashes built on it: ``profile_hash`` and the build-input fingerprint.

Canonical = sorted keys, no whitespace, UTF-8, no NaN; pydantic's JSON mode turns enums, tuples
and floats into stable JSON values, so the same inputs hash the same in every process.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from policy_engine.model import Grant, Manifest, Overrides, Profile, Settings


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _dump(model: BaseModel | None) -> Any:
    return None if model is None else model.model_dump(mode="json")


EXPLANATORY: dict[str, Any] = {"limit_layers": True,
                               "capabilities": {"__all__": {"limit_layers"}}}
"""What ``profile_hash`` leaves out (``shape.HashTemplate`` must leave out the same)."""

CALL_FIELDS: tuple[str, ...] = ("budget", "call_id", "consent", "expires_at")
"""The profile's per-call fields (copied from the grant, never met), hashed apart from the rest."""


def shape_digest(profile: Profile, policy_version_hash: str, manifest_version: str) -> str:
    """SHA-256 of every field but the per-call ones (and ``profile_hash``) plus both versions."""
    body = profile.model_dump(mode="json", exclude={**EXPLANATORY,
                                                    **dict.fromkeys(CALL_FIELDS, True),
                                                    "profile_hash": True})
    return sha256_hex(canonical_json({
        "profile": body,
        "policy_version_hash": policy_version_hash,
        "manifest_version": manifest_version,
    }))


def call_digest_input(call: str, shape: str) -> str:
    """What ``profile_hash`` hashes: ``{"call":<call fields>,"shape":"<shape digest>"}``, with
    ``call`` the canonical JSON of the call fields (``CALL_FIELDS``, sorted keys)."""
    return '{"call":' + call + ',"shape":"' + shape + '"}'


def profile_hash(profile: Profile, policy_version_hash: str, manifest_version: str) -> str:
    """SHA-256 of the profile in two levels: the canonical JSON of its per-call fields next to
    the ``shape_digest`` of everything else (and the policy and manifest versions).

    Two levels because grants are per call: every call of one grant shape shares the shape
    digest, so a call's hash reads a few hundred bytes instead of the whole profile (with a
    large policy, kilobytes of denies). The hash still covers every field: the shape digest is
    a SHA-256 of the rest. ``limit_layers`` is left out: it explains where a limit came from and
    decides nothing, so the hash (and every pinned evidence record) depends on the values alone.
    """
    dumped = profile.model_dump(mode="json", include=set(CALL_FIELDS))
    call = canonical_json({name: dumped.get(name) for name in CALL_FIELDS})
    return sha256_hex(call_digest_input(
        call, shape_digest(profile, policy_version_hash, manifest_version)))


def fingerprint(
    grant: Grant, manifest: Manifest, settings: Settings | None, overrides: Overrides | None
) -> str:
    """Content key of one build's inputs (the policy is fixed per builder, so it is left out)."""
    return sha256_hex(canonical_json({
        "grant": _dump(grant),
        "manifest": _dump(manifest),
        "settings": _dump(settings),
        "overrides": _dump(overrides),
    }))
