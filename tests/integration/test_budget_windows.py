"""The SQLite meter's per-window counts (the service's requests a minute): exact under 8 threads
and 4 processes (spawned and forked), across windows, and when a key finds no free slot."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from plugins.budget_sqlite import SqliteBudgetMeter
from plugins.budget_sqlite.window import PROBE, SLOTS
from policy_engine.budget import counts_windows
from policy_engine.errors import PolicyEngineError

pytestmark = pytest.mark.integration

LIMIT = 60
ATTEMPTS = 25  # per worker: 8 threads + 4 processes × 25 = 300 attempts for 60


def hammer(meter: SqliteBudgetMeter, attempts: int, key: str = "service-rate/acme") -> int:
    ok = 0
    codes: set[str] = set()
    for _ in range(attempts):
        try:
            meter.charge_window(key, 7, LIMIT)
        except PolicyEngineError as exc:
            codes.add(exc.code.value)
            continue
        ok += 1
    assert codes <= {"QUOTA.BUDGET_EXCEEDED"}, codes
    return ok


def process_worker(db: str, attempts: int, queue: multiprocessing.Queue[int]) -> None:
    meter = SqliteBudgetMeter(Path(db))
    queue.put(hammer(meter, attempts))
    meter.close()


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_threads_and_processes_count_exactly_to_the_limit(tmp_path: Path, start: str) -> None:
    db = tmp_path / "budget.sqlite"
    meter = SqliteBudgetMeter(db)
    assert counts_windows(meter)
    meter.charge_window("service-rate/other", 7, LIMIT)  # opened before a fork: not shared
    ctx = multiprocessing.get_context(start)
    queue: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=process_worker,  # type: ignore[attr-defined] # a str method
                         args=(str(db), ATTEMPTS, queue)) for _ in range(4)]
    results: list[int] = []
    lock = threading.Lock()

    def thread_worker() -> None:
        n = hammer(meter, ATTEMPTS)
        with lock:
            results.append(n)

    threads = [threading.Thread(target=thread_worker) for _ in range(8)]
    for p in procs:
        p.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results += [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(results) == LIMIT
    assert meter.window_count("service-rate/acme", 7) == LIMIT
    assert meter.window_count("service-rate/other", 7) == 1
    # nothing counted in budget_usage: no durable write per request
    assert meter.used("service-rate/acme/7") == {}
    meter.close()


def test_a_new_window_starts_at_zero_and_reuses_the_slot(tmp_path: Path) -> None:
    meter = SqliteBudgetMeter(tmp_path / "budget.sqlite")
    assert [meter.charge_window("k", 1, 2) for _ in range(2)] == [1, 2]
    with pytest.raises(PolicyEngineError, match="budget of 2 would be exceeded"):
        meter.charge_window("k", 1, 2)
    assert meter.charge_window("k", 2, 2) == 1
    assert meter.window_count("k", 1) == 0  # the old window's count is gone with its slot
    assert meter.window_count("k", 2) == 1
    with pytest.raises(PolicyEngineError):
        meter.charge_window("zero", 2, 0)
    meter.close()
    again = SqliteBudgetMeter(tmp_path / "budget.sqlite")  # the count survives a restart
    assert again.window_count("k", 2) == 1
    again.close()


def _home(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=16).digest()[:4],
                          "little") % SLOTS


def test_a_key_without_a_free_slot_is_counted_in_sqlite_exactly(tmp_path: Path) -> None:
    colliding: list[str] = []
    i = 0
    while len(colliding) < PROBE + 1:  # keys whose home slot is 0: ≈ 270,000 digests
        key = f"t{i}"
        if _home(key) == 0:
            colliding.append(key)
        i += 1
    meter = SqliteBudgetMeter(tmp_path / "budget.sqlite")
    for key in colliding[:PROBE]:  # slots 0..PROBE-1 hold live keys of window 3
        meter.charge_window(key, 3, 5)
    last = colliding[PROBE]
    assert [meter.charge_window(last, 3, 2) for _ in range(2)] == [1, 2]
    with pytest.raises(PolicyEngineError):
        meter.charge_window(last, 3, 2)
    assert meter.used(f"{last}/3") == {"calls": 2}  # the fallback: one SQLite row
    assert meter.window_count(last, 3) == 2
    assert os.path.getsize(tmp_path / "budget.rate") == SLOTS * 32
    meter.close()


def test_without_the_shared_table_the_sqlite_row_counts(tmp_path: Path) -> None:
    (tmp_path / "budget.rate").mkdir()  # cannot be opened as the table: an OSError each time
    meter = SqliteBudgetMeter(tmp_path / "budget.sqlite")
    assert [meter.charge_window("k", 4, 2) for _ in range(2)] == [1, 2]
    with pytest.raises(PolicyEngineError, match="budget of 2 would be exceeded"):
        meter.charge_window("k", 4, 2)
    assert meter.used("k/4") == {"calls": 2}
    assert meter.window_count("k", 4) == 2
    meter.close()
