"""Budget atomicity under real concurrency: 8 threads and 4 processes hammer one grant."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from plugins.budget_memory import MemoryBudgetMeter
from plugins.budget_sqlite import SqliteBudgetMeter
from policy_engine.budget import BudgetMeter
from policy_engine.errors import PolicyEngineError

pytestmark = pytest.mark.integration

LIMIT = 60
ATTEMPTS = 25  # per worker; 12 workers × 25 = 300 attempts for 60 slots


def hammer(meter: BudgetMeter, attempts: int) -> int:
    ok = 0
    for _ in range(attempts):
        try:
            meter.check_and_consume("acme/agent:1/c1", "calls", 1, LIMIT)
        except PolicyEngineError:
            continue
        ok += 1
    return ok


def process_worker(db: str, attempts: int, queue: multiprocessing.Queue[int]) -> None:
    meter = SqliteBudgetMeter(Path(db))
    queue.put(hammer(meter, attempts))
    meter.close()


def test_sqlite_meter_threads_and_processes_never_exceed_the_limit(tmp_path: Path) -> None:
    db = tmp_path / "budget.sqlite"
    meter = SqliteBudgetMeter(db)
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no shared connections
    queue: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=process_worker, args=(str(db), ATTEMPTS, queue))
             for _ in range(4)]
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
    results.extend(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(results) == 12
    assert sum(results) == LIMIT
    assert meter.used("acme/agent:1/c1") == {"calls": LIMIT}
    meter.close()


def test_memory_meter_threads_never_exceed_the_limit() -> None:
    meter = MemoryBudgetMeter()
    results: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        n = hammer(meter, ATTEMPTS * 2)
        with lock:
            results.append(n)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == LIMIT
    assert meter.used("acme/agent:1/c1") == {"calls": LIMIT}
