"""Restricted network mode: a host-side policy proxy reached from a sealed network namespace."""

from policy_engine.netproxy.restricted import (
    SANDBOX_DIR,
    RestrictedHandle,
    RestrictedNetwork,
    default_python,
)

__all__ = ["SANDBOX_DIR", "RestrictedHandle", "RestrictedNetwork", "default_python"]
