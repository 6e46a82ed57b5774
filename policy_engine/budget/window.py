"""Per-window counters (requests a minute): the protocol a meter implements to count them cheaply.

A rate limit is a count per (key, window) that nobody needs after its window: the service's
per-tenant requests a minute (``service.guards.charge_rate``). A meter that can count those
exactly across every process sharing it, without a durable write per request, implements
``WindowCounter`` (the SQLite meter: a lock-guarded shared-memory table beside its database,
``plugins/budget_sqlite/window.py``); for any other meter the count goes through
``check_and_consume`` (Redis: one atomic script on the server every replica shares, so the
replicas' limit stays exact; memory: this process's dict).
"""

from __future__ import annotations

from typing import Protocol, TypeGuard, runtime_checkable


@runtime_checkable
class WindowCounter(Protocol):
    """Counts per key and window, exact across the processes that share the meter."""

    def charge_window(self, key: str, window: int, limit: int) -> int:
        """Count one more for ``key`` in ``window`` if the count stays within ``limit``;
        return the new count.

        :raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` over ``limit`` (nothing counted);
            ``PROVIDER.UNAVAILABLE`` when the counter cannot be used (fails closed).
        """
        ...

    def window_count(self, key: str, window: int) -> int:
        """How many were counted for ``key`` in ``window`` (0 for another window)."""
        ...


_KNOWN: dict[type, bool] = {}


def counts_windows(meter: object) -> TypeGuard[WindowCounter]:
    """Whether ``meter`` is a ``WindowCounter``, remembered per class: ``isinstance`` against a
    runtime-checkable protocol inspects every method (≈ 15 µs, more than the count itself)."""
    cls = type(meter)
    known = _KNOWN.get(cls)
    if known is None:
        known = _KNOWN[cls] = isinstance(meter, WindowCounter)
    return known
