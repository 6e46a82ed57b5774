"""Budget metering: the meter protocol and its helpers; implementations are plugins."""

from policy_engine.budget.concurrency import (
    PROCESS_SLOTS,
    ConcurrencyMeter,
    ProcessSlots,
    new_lease,
    too_many,
)
from policy_engine.budget.meter import (
    BudgetMeter,
    check_amount,
    check_kind,
    exceeded,
    grant_key,
    limit_of,
)
from policy_engine.budget.window import WindowCounter, counts_windows

__all__ = [
    "PROCESS_SLOTS", "BudgetMeter", "ConcurrencyMeter", "ProcessSlots", "check_amount",
    "check_kind", "exceeded", "grant_key", "limit_of", "new_lease", "too_many", "WindowCounter",
    "counts_windows",
]
