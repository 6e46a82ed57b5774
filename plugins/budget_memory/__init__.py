"""In-memory budget meter (``budget_meter: memory``): one process, a lock per meter."""

from __future__ import annotations

import threading
from collections import defaultdict

from policy_engine.budget import BudgetMeter, ProcessSlots, check_amount, exceeded
from policy_engine.config import EngineConfig
from policy_engine.hookspecs import hookimpl


class MemoryBudgetMeter(ProcessSlots):
    """Counters in a dict guarded by one lock: the check and the add happen under it, so no two
    threads can both pass a check that only one of them fits in.
    """

    name = "memory"

    def __init__(self) -> None:
        super().__init__()  # concurrency slots (ConcurrencyMeter): this process's calls
        self._lock = threading.Lock()
        self._used: dict[str, dict[str, int]] = defaultdict(dict)

    def check_and_consume(self, grant_key: str, kind: str, amount: int, limit: int | None) -> int:
        check_amount(kind, amount)
        with self._lock:
            counters = self._used[grant_key]
            used = counters.get(kind, 0)
            if limit is not None and used + amount > limit:
                raise exceeded(grant_key, kind, limit, used, amount)
            counters[kind] = used + amount
            return used + amount

    def used(self, grant_key: str) -> dict[str, int]:
        with self._lock:
            return dict(self._used.get(grant_key, {}))

    def close(self) -> None:
        """Nothing to release: the counters die with the process."""


@hookimpl
def policy_engine_budget_meter(config: EngineConfig) -> BudgetMeter | None:
    return MemoryBudgetMeter() if config.wants_meter(MemoryBudgetMeter.name) else None
