"""Every lint check, grouped by rule family; the driver runs them in this order."""

from policy_engine.lint.rules import breadth, hygiene, limits, logic, network, process
from policy_engine.lint.rules.base import Check

CHECKS: tuple[Check, ...] = (
    *breadth.CHECKS, *process.CHECKS, *network.CHECKS, *limits.CHECKS, *logic.CHECKS,
    *hygiene.CHECKS,
)

__all__ = ["CHECKS", "Check"]
