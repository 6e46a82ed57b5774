"""Budget metering: the meter protocol; implementations are plugins (memory, SQLite)."""

from policy_engine.budget.meter import BudgetMeter

__all__ = ["BudgetMeter"]
