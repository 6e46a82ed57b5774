"""Profile synthesis: the meet of grant, manifest and policy, layered limits, hashing, caching."""

from policy_engine.profile.builder import ProfileBuilder
from policy_engine.profile.cache import ProfileCache
from policy_engine.profile.hashing import canonical_json, profile_hash
from policy_engine.profile.layers import meet_limits, resolve_limits, resolve_network

__all__ = [
    "ProfileBuilder", "ProfileCache", "canonical_json", "meet_limits", "profile_hash",
    "resolve_limits", "resolve_network",
]
