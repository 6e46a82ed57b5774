"""Helpers of the orchestrator: backend selection against capabilities, revocation lists."""

from policy_engine.orchestration.revocation import (
    MemoryRevocationList,
    RevocationWatcher,
    SqliteRevocationList,
)
from policy_engine.orchestration.selection import Selection, required_capabilities, select

__all__ = [
    "MemoryRevocationList", "RevocationWatcher", "Selection", "SqliteRevocationList",
    "required_capabilities", "select",
]
