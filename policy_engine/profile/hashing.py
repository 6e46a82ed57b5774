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


def profile_hash(profile: Profile, policy_version_hash: str, manifest_version: str) -> str:
    """SHA-256 of the profile (with an empty ``profile_hash``) plus policy and manifest versions.

    ``limit_layers`` is left out: it explains where a limit came from and decides nothing, so
    the hash (and every pinned evidence record) depends on the values alone.
    """
    body = profile.model_dump(mode="json", exclude=EXPLANATORY)
    body["profile_hash"] = ""
    return sha256_hex(canonical_json({
        "profile": body,
        "policy_version_hash": policy_version_hash,
        "manifest_version": manifest_version,
    }))


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
