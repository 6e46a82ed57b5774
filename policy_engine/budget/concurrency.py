"""Concurrency slots: at most ``max_concurrency`` calls of one grant in flight at once.

A meter that can count slots across processes implements ``ConcurrencyMeter`` (the SQLite meter
does, with lease rows that expire and die with their process); for any other meter the
orchestrator falls back to ``ProcessSlots``, which counts the calls of this process only.
A call over the limit is refused at once with ``QUOTA.BUDGET_EXCEEDED`` (it does not wait: an
agent retrying later is cheaper than a blocked worker, and the answer is predictable).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Protocol, runtime_checkable

from policy_engine.errors import ErrorCode, PolicyEngineError


@runtime_checkable
class ConcurrencyMeter(Protocol):
    """Slots of one grant, held by the calls in flight."""

    def acquire(self, grant_key: str, limit: int, *, hold_s: float) -> str:
        """Take one of ``limit`` slots of ``grant_key`` and return its lease id.

        :param hold_s: the longest the call can run; a lease not released by then (its
            process was killed) is free again after it.
        :raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` when ``limit`` slots are held.
        """
        ...

    def release(self, grant_key: str, lease: str) -> None:
        """Give the slot back; releasing an unknown or expired lease does nothing."""
        ...


def too_many(grant_key: str, limit: int, held: int) -> PolicyEngineError:
    """The refusal of the N+1th concurrent call."""
    return PolicyEngineError(
        ErrorCode.BUDGET_EXCEEDED,
        f"`concurrency` limit of {limit} calls in flight reached",
        audit={"grant_key": grant_key, "kind": "concurrency", "limit": limit, "held": held})


def new_lease() -> str:
    return secrets.token_hex(12)


class ProcessSlots:
    """``ConcurrencyMeter`` for one process: a dict of leases under a lock.

    Leases carry their expiry too, so a lease whose release was lost (a bug, never a normal
    path: the orchestrator releases in ``finally``) cannot hold a slot for ever.
    """

    def __init__(self) -> None:
        self._slots_lock = threading.Lock()
        self._slot_leases: dict[str, dict[str, float]] = {}

    def acquire(self, grant_key: str, limit: int, *, hold_s: float) -> str:
        now = time.monotonic()
        with self._slots_lock:
            held = self._slot_leases.setdefault(grant_key, {})
            for lease, until in list(held.items()):
                if until <= now:
                    del held[lease]
            if len(held) >= limit:
                raise too_many(grant_key, limit, len(held))
            lease = new_lease()
            held[lease] = now + hold_s
            return lease

    def release(self, grant_key: str, lease: str) -> None:
        with self._slots_lock:
            held = self._slot_leases.get(grant_key)
            if held is not None:
                held.pop(lease, None)
                if not held:
                    del self._slot_leases[grant_key]

    def held(self, grant_key: str) -> int:
        with self._slots_lock:
            return len(self._slot_leases.get(grant_key, {}))


PROCESS_SLOTS = ProcessSlots()
"""The fallback for meters that cannot count slots themselves (shared by this process)."""
