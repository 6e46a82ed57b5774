"""The one call path under every face: identity → revocation → decide → consent → run → outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policy_engine.lazy import lazy_exports

if TYPE_CHECKING:
    from policy_engine.gateway.call import Call, Gateway
    from policy_engine.gateway.outcome import Called
    from policy_engine.gateway.sessions import SandboxManager

_WHERE = {"Call": "call", "Gateway": "call", "Called": "outcome", "SandboxManager": "sessions"}
__all__ = ["Call", "Called", "Gateway", "SandboxManager"]
_get, _listing = lazy_exports(__name__, _WHERE, __all__)


def __getattr__(name: str) -> Any:
    return _get(name)


def __dir__() -> list[str]:
    return _listing()
