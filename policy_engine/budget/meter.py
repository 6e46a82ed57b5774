"""The BudgetMeter protocol: atomic check-and-consume per grant and budget kind."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class BudgetMeter(Protocol):
    """Counts what each grant has consumed; atomic under concurrent threads and processes."""

    name: str

    def check_and_consume(self, grant_key: str, kind: str, amount: int, limit: int | None) -> int:
        """Atomically add ``amount`` of ``kind`` to what ``grant_key`` used if it stays within
        ``limit`` (``None`` = unlimited) and return the new total.

        :raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` when it would exceed ``limit``;
            nothing is consumed then.
        """
        ...

    def used(self, grant_key: str) -> dict[str, int]:
        """What ``grant_key`` has consumed so far, by kind."""
        ...

    def close(self) -> None:
        ...
