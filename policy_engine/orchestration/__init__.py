"""Helpers of the orchestrator: backend selection against capabilities, revocation lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policy_engine.lazy import lazy_exports

if TYPE_CHECKING:
    from policy_engine.orchestration.revocation import (
        MemoryRevocationList,
        RevocationWatcher,
        SqliteRevocationList,
    )
    from policy_engine.orchestration.selection import Selection, required_capabilities, select

# Imported on first use (PEP 562): `explain` uses the selection and must not load sqlite3 for
# the revocation lists.
_WHERE: dict[str, str] = {
    **dict.fromkeys(("MemoryRevocationList", "RevocationWatcher", "SqliteRevocationList"),
                    "revocation"),
    **dict.fromkeys(("Selection", "required_capabilities", "select"), "selection"),
}

__all__ = [
    "MemoryRevocationList", "RevocationWatcher", "Selection", "SqliteRevocationList",
    "required_capabilities", "select",
]


_get, _listing = lazy_exports(__name__, _WHERE, __all__)


def __getattr__(name: str) -> Any:
    return _get(name)


def __dir__() -> list[str]:
    return _listing()
