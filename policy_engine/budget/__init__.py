"""Budget metering: the meter protocol and its helpers; implementations are plugins."""

from policy_engine.budget.meter import (
    BudgetMeter,
    check_amount,
    check_kind,
    exceeded,
    grant_key,
    limit_of,
)

__all__ = ["BudgetMeter", "check_amount", "check_kind", "exceeded", "grant_key", "limit_of"]
