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


_CHARGES_SLOTS: dict[type, bool] = {}


def charges_with_slots(meter: BudgetMeter) -> bool:
    """Whether ``meter`` takes a slot with a charge, and gives it back with charges, in one
    step each (``acquire_charging``, ``release_charging``: the SQLite meter's shared table,
    one lock for both; issue 27), remembered per class."""
    known = _CHARGES_SLOTS.get(type(meter))
    if known is None:
        known = _CHARGES_SLOTS[type(meter)] = _counts_slots(meter) and all(
            callable(getattr(meter, m, None)) for m in ("acquire_charging", "release_charging"))
    return known


class Slot:
    """One of the grant's ``max_concurrency`` slots, held by a call until it ends.

    The meter's own slots when it counts them across processes (``ConcurrencyMeter``), else
    this process's (``PROCESS_SLOTS``).
    """

    def __init__(self, meter: BudgetMeter, key: str, limits: Limits, timeout_ms: int) -> None:
        self.meter = meter
        self.slots = meter if _counts_slots(meter) else PROCESS_SLOTS
        self.key = key
        self.limit = limits.max_concurrency
        self.hold_s = (limits.timeout_ms or timeout_ms) / 1000 + LEASE_GRACE_S
        self.lease: str | None = None

    def take(self) -> None:
        """:raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` when every slot is held."""
        if self.limit is not None:
            self.lease = self.slots.acquire(self.key, self.limit, hold_s=self.hold_s)

    def take_charging(self, kind: str, amount: int, limit: int | None) -> None:
        """``take`` and the meter's ``check_and_consume`` of ``kind``: in one step where the
        meter ``charges_with_slots``, else one after the other (the slot given back when the
        charge is refused); both or neither.

        :raises PolicyEngineError: either's refusal."""
        if self.limit is None:
            self.meter.check_and_consume(self.key, kind, amount, limit)
        elif charges_with_slots(self.meter):
            self.lease = self.meter.acquire_charging(  # type: ignore[attr-defined]
                self.key, self.limit, hold_s=self.hold_s, kind=kind, amount=amount,
                charge_limit=limit)
        else:
            self.take()
            try:
                self.meter.check_and_consume(self.key, kind, amount, limit)
            except BaseException:
                self.release()
                raise

    def release_charging(self, charges: list[tuple[str, int, int | None]]) -> None:
        """The meter's ``check_and_consume`` of each charge in order, then ``release``: in one
        step where the meter ``charges_with_slots``; the slot is given back whatever the
        charges do.

        :raises PolicyEngineError: the first refused charge's refusal (those before it are
            charged)."""
        if self.lease is None or not charges_with_slots(self.meter):
            try:
                for kind, amount, limit in charges:
                    self.meter.check_and_consume(self.key, kind, amount, limit)
            finally:
                self.release()
            return
        lease, self.lease = self.lease, None
        self.meter.release_charging(self.key, lease, charges)  # type: ignore[attr-defined]

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
