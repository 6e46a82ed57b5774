"""What one call runs under and what it holds: its effective limits, its concurrency slot, and
the late charge of its `calls` budget (docs/operations.md "Budgets and revocation")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeGuard

from policy_engine.budget import PROCESS_SLOTS, BudgetMeter, ConcurrencyMeter
from policy_engine.errors import PolicyEngineError
from policy_engine.model import Decision, Limits, Profile
from policy_engine.orchestration.running import Attempt

log = logging.getLogger(__name__)

LEASE_GRACE_S = 60.0
"""How long past its timeout a call's concurrency lease outlives a process that never released
it (killed on another host; on the same host a dead holder's lease is dropped at once)."""


def call_limits(decision: Decision, profile: Profile) -> Limits:
    """The limits the call runs under: the decision's (profile ⊓ permitting rule ⊓ op); for a
    guard that does not say, the profile's with its ``timeout_ms``."""
    if decision.limits is not None:
        return decision.limits
    timeout = min((t for t in (profile.limits.timeout_ms, profile.timeout_ms) if t),
                  default=None)
    return profile.limits.model_copy(update={"timeout_ms": timeout})


_COUNTS_SLOTS: dict[type, bool] = {}


def _counts_slots(meter: BudgetMeter) -> TypeGuard[ConcurrencyMeter]:
    """``isinstance(meter, ConcurrencyMeter)``, remembered per class: against a runtime-checkable
    protocol it inspects every method on each call (≈ 6–15 µs, a fifth of a lease)."""
    known = _COUNTS_SLOTS.get(type(meter))
    if known is None:
        known = _COUNTS_SLOTS[type(meter)] = isinstance(meter, ConcurrencyMeter)
    return known


class Slot:
    """One of the grant's ``max_concurrency`` slots, held by a call until it ends.

    The meter's own slots when it counts them across processes (``ConcurrencyMeter``), else
    this process's (``PROCESS_SLOTS``).
    """

    def __init__(self, meter: BudgetMeter, key: str, limits: Limits, timeout_ms: int) -> None:
        self.slots = meter if _counts_slots(meter) else PROCESS_SLOTS
        self.key = key
        self.limit = limits.max_concurrency
        self.hold_s = (limits.timeout_ms or timeout_ms) / 1000 + LEASE_GRACE_S
        self.lease: str | None = None

    def take(self) -> None:
        """:raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` when every slot is held."""
        if self.limit is not None:
            self.lease = self.slots.acquire(self.key, self.limit, hold_s=self.hold_s)

    def release(self) -> None:
        """Give the slot back; a failure is logged (the lease expires), never raised."""
        if self.lease is None:
            return
        lease, self.lease = self.lease, None
        try:
            self.slots.release(self.key, lease)
        except Exception:  # noqa: BLE001 — the lease expires; the call's answer stands
            log.exception("releasing a concurrency slot of %s failed", self.key)


def nothing() -> None:
    """``on_start`` of an executor charged before it runs."""


def charged_late(attempt: Attempt, charge_call: Callable[[], None]) -> Attempt:
    """Charge ``calls`` for an executor that ran without calling ``ctx.started()``; over
    budget, its output is withheld."""
    try:
        charge_call()
    except PolicyEngineError as exc:
        return Attempt(None, exc, "quota")
    return attempt
