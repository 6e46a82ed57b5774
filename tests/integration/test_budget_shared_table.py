"""The SQLite meter's shared-memory table (plugins/budget_sqlite/shared.py): counts and slots
exact across real processes, a killed process's charges kept and written by the next, a killed
holder's slot freed, another boot's table discarded, and keys too long for a slot counted in the
database alone (one home per counter).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from plugins.budget_sqlite import SqliteBudgetMeter
from plugins.budget_sqlite.shared import KEY_MAX, MAGIC
from policy_engine.errors import PolicyEngineError

pytestmark = pytest.mark.integration
SPAWN = multiprocessing.get_context("spawn")  # fresh interpreters: nothing shared but files


def _database_count(db: Path, key: str, kind: str = "calls") -> int:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT used FROM budget_usage WHERE grant_key = ? AND kind = ?",
                           (key, kind)).fetchone()
    return int(row[0]) if row else 0


def _take(db: str, key: str, limit: int, go: Any, answers: Any, hold: Any) -> None:
    meter = SqliteBudgetMeter(Path(db))
    go.wait()
    try:
        meter.acquire(key, limit, hold_s=60)
    except PolicyEngineError as exc:
        answers.put(exc.code.value)
        return
    answers.put("held")
    hold.wait()  # hold the slot until the parent has counted


@pytest.mark.parametrize("key", ["g", "k" * (KEY_MAX + 10)], ids=["table", "long-key"])
def test_processes_racing_for_two_slots(tmp_path: Path, key: str) -> None:
    db = tmp_path / "budget.sqlite"
    SqliteBudgetMeter(db).close()
    go, hold, answers = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=_take, args=(str(db), key, 2, go, answers, hold))
             for _ in range(6)]
    for p in procs:
        p.start()
    go.set()
    got = sorted(answers.get(timeout=60) for _ in procs)
    hold.set()
    for p in procs:
        p.join(timeout=60)
    assert got == ["QUOTA.BUDGET_EXCEEDED"] * 4 + ["held"] * 2, got


def _hold_forever(db: str, ready: Any) -> None:
    SqliteBudgetMeter(Path(db)).acquire("g", 1, hold_s=3600)
    ready.set()
    time.sleep(3600)


def test_a_killed_holder_does_not_leak_its_slot(tmp_path: Path) -> None:
    db = tmp_path / "budget.sqlite"
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=_hold_forever, args=(str(db), ready))
    holder.start()
    assert ready.wait(60)
    meter = SqliteBudgetMeter(db)
    with pytest.raises(PolicyEngineError, match="concurrency"):
        meter.acquire("g", 1, hold_s=60)  # held by a live process
    os.kill(holder.pid or 0, signal.SIGKILL)
    holder.join(timeout=60)
    lease = meter.acquire("g", 1, hold_s=60)  # the dead holder's slot is dropped
    with pytest.raises(PolicyEngineError, match="concurrency"):
        meter.acquire("g", 1, hold_s=60)
    meter.release("g", lease)
    meter.release("g", lease)  # a second release of the same lease gives back nothing
    assert meter.acquire("g", 1, hold_s=60)
    meter.close()


def _charge_and_die(db: str, key: str, times: int) -> None:
    meter = SqliteBudgetMeter(Path(db))
    for _ in range(times):
        meter.check_and_consume(key, "calls", 1, 100)
    os.kill(os.getpid(), signal.SIGKILL)  # before the write behind (0.2 s) and any close


def _killed_after_charging(db: Path, key: str, times: int) -> None:
    child = SPAWN.Process(target=_charge_and_die, args=(str(db), key, times))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL


def test_a_killed_process_charges_stay_counted_and_the_next_process_writes_them(
        tmp_path: Path) -> None:
    db = tmp_path / "budget.sqlite"
    _killed_after_charging(db, "g", 7)
    assert _database_count(db, "g") == 0  # never written: the process died first
    meter = SqliteBudgetMeter(db)
    assert meter.used("g") == {"calls": 7}  # the table kept them
    with pytest.raises(PolicyEngineError, match="budget"):
        meter.check_and_consume("g", "calls", 94, 100)  # 7 + 94 > 100: still exact
    assert _database_count(db, "g") == 7  # written when the table was opened again
    meter.close()


def test_a_table_of_another_boot_is_discarded_and_the_database_counts(tmp_path: Path) -> None:
    """An OS crash may leave the table torn: a table written in another boot is not trusted;
    the database's counts (written behind) stand, losing at most the charges of the last
    interval."""
    db = tmp_path / "budget.sqlite"
    meter = SqliteBudgetMeter(db)
    meter.check_and_consume("g", "calls", 5, 100)
    meter.close()  # written: the database holds 5
    _killed_after_charging(db, "g", 3)  # 8 in the table, 5 in the database
    table = db.with_suffix(".meter")
    with table.open("r+b") as fh:
        assert fh.read(8) == MAGIC
        fh.write(b"another boot id!")  # as if the machine had restarted
    again = SqliteBudgetMeter(db)
    assert again.used("g") == {"calls": 5}
    assert again.check_and_consume("g", "calls", 1, 100) == 6
    again.close()
    assert _database_count(db, "g") == 6


def test_long_keys_are_counted_in_the_database_only(tmp_path: Path) -> None:
    db = tmp_path / "budget.sqlite"
    key = "t/" + "s" * KEY_MAX
    first, second = SqliteBudgetMeter(db), SqliteBudgetMeter(db)
    assert first.check_and_consume(key, "calls", 2, 3) == 2
    assert _database_count(db, key) == 2  # written at once, not behind
    with pytest.raises(PolicyEngineError):
        second.check_and_consume(key, "calls", 2, 3)
    assert second.used(key) == {"calls": 2}
    lease = first.acquire(key, 1, hold_s=60)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM budget_leases WHERE grant_key = ?",
                            (key,)).fetchone()[0] == 1
    with pytest.raises(PolicyEngineError, match="concurrency"):
        second.acquire(key, 1, hold_s=60)
    first.release(key, lease)
    assert second.acquire(key, 1, hold_s=60)
    first.close()
    second.close()


def test_many_grants_overflow_the_table_into_the_database_exactly(tmp_path: Path) -> None:
    """More counters than the table holds: the oldest are written and evicted, each count
    still exact (read back through another meter)."""
    db = tmp_path / "budget.sqlite"
    meter, other = SqliteBudgetMeter(db), SqliteBudgetMeter(db)
    keys = [f"t/s/c{i}" for i in range(1500)]  # the table has 1,024 slots
    for round_ in (1, 2):
        for key in keys:
            assert meter.check_and_consume(key, "calls", 1, 2) == round_
    for key in keys[:50] + keys[-50:]:
        with pytest.raises(PolicyEngineError):
            other.check_and_consume(key, "calls", 1, 2)
        assert other.used(key) == {"calls": 2}
    meter.close()
    other.close()
    assert {_database_count(db, key) for key in keys} == {2}
