"""The BudgetMeter protocol: atomic check-and-consume per grant and budget kind."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import BUDGET_KINDS, Budget, Grant, Profile


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


def grant_key(grant: Grant | Profile) -> str:
    """The key budgets are counted under: the grant's ``decision_key_fingerprint`` when it has
    one (several calls sharing one authorization share its budget), else tenant/subject/call.
    """
    fingerprint = getattr(grant, "decision_key_fingerprint", "")
    if fingerprint:
        return str(fingerprint)
    return f"{grant.tenant}/{grant.subject_id}/{grant.call_id}"


def limit_of(budget: Budget, kind: str) -> int | None:
    """The limit of ``kind`` in ``budget`` (``None`` = unlimited)."""
    check_kind(kind)
    value: int | None = getattr(budget, kind)
    return value


def check_kind(kind: str) -> None:
    if kind not in BUDGET_KINDS:
        raise ValueError(f"unknown budget kind `{kind}`; expected one of {', '.join(BUDGET_KINDS)}")


def check_amount(kind: str, amount: int) -> None:
    """Refuse nonsense before touching any counter (a negative amount would refund budget)."""
    check_kind(kind)
    if amount < 0:
        raise ValueError(f"budget amount for `{kind}` must be >= 0, got {amount}")


def exceeded(grant_key: str, kind: str, limit: int, used: int, amount: int) -> PolicyEngineError:
    """The ``QUOTA.BUDGET_EXCEEDED`` error, with the numbers in the audit detail."""
    return PolicyEngineError(
        ErrorCode.BUDGET_EXCEEDED,
        f"`{kind}` budget of {limit} would be exceeded",
        audit={"grant_key": grant_key, "kind": kind, "limit": limit, "used": used,
               "amount": amount},
    )
