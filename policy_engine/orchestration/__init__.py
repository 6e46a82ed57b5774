"""Helpers of the orchestrator: backend selection against capabilities, revocation lists."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
