"""`concurrency` is enforced per grant (issue 10 item 7): the N+1th call in flight is refused
with QUOTA.BUDGET_EXCEEDED, across threads and engine processes, and a slot is released on
every exit path, a killed process included.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from plugins.budget_memory import MemoryBudgetMeter
from plugins.budget_sqlite import SqliteBudgetMeter
from plugins.budget_sqlite.leases import SqliteLeases
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.errors import PolicyEngineError
from policy_engine.model import Grant, Manifest, ProcExecOp
from policy_engine.orchestrator import Orchestrator, RunOutcome

pytestmark = pytest.mark.integration
FAR = 4_102_444_800_000
POLICY = """policy "t/concurrency" version "1.0.0"
defaults { timeout 20s  limits { concurrency 2 } }
permit "sleep" proc.exec tool "sleep"
"""
CAPS = [{"kind": "proc.exec", "tool": "sleep"}]
GRANT: dict[str, Any] = {
    "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
    "capabilities": CAPS, "expires_at": FAR,
    "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": FAR}}
MANIFEST: dict[str, Any] = {"name": "tool", "version": "1", "permissions": CAPS,
                            "side_effects": ["Process"], "safety_class": "Low"}


@pytest.mark.parametrize("meter", ["sqlite", "memory"])
def test_threads_through_the_orchestrator_get_two_slots(tmp_path: Path, meter: str) -> None:
    (tmp_path / "p.sbpolicy").write_text(POLICY)
    config = EngineConfig(state_dir=tmp_path / "state", revocation="memory", budget_meter=meter)
    grant, manifest = Grant.model_validate(GRANT), Manifest.model_validate(MANIFEST)
    results: list[RunOutcome] = []
    lock = threading.Lock()
    with Orchestrator(compile_files([tmp_path / "p.sbpolicy"]), config=config) as orch:
        barrier = threading.Barrier(5)

        def call() -> None:
            barrier.wait()
            out = orch.run(grant, manifest, ProcExecOp(tool="sleep", args=("2",)))
            with lock:
                results.append(out)

        threads = [threading.Thread(target=call) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(str(r.result.code) for r in results)
        assert codes == ["None", "None"] + ["QUOTA.BUDGET_EXCEEDED"] * 3, codes
        refused = [r for r in results if not r.result.ok]
        assert all(r.end.status == "denied" and r.end.budget_used.calls == 0 for r in refused)
        assert "concurrency" in (refused[0].result.message or "")
        # every slot came back: two more calls run side by side
        again = orch.run(grant, manifest, ProcExecOp(tool="sleep", args=("0",)))
        assert again.result.ok, again.result


def test_engine_processes_share_the_slots(tmp_path: Path) -> None:
    """Three `policy-engine run` processes on one state dir, concurrency 1: one runs."""
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(POLICY.replace("concurrency 2", "concurrency 1"))
    (tmp_path / "g.json").write_text(json.dumps(GRANT))
    (tmp_path / "m.json").write_text(json.dumps(MANIFEST))
    argv = [sys.executable, "-m", "policy_engine.cli", "run", "--policy", str(policy),
            "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
            "--state-dir", str(tmp_path / "state"), "--format", "json", "--", "sleep", "5"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    codes = sorted(str(o["result"]["code"]) for o in outs)
    assert codes == ["None", "QUOTA.BUDGET_EXCEEDED", "QUOTA.BUDGET_EXCEEDED"], codes


def _hold(db: str, started: Any, go: Any, done: Any) -> None:
    leases = SqliteLeases(Path(db))
    go.wait()
    try:
        leases.acquire("g", 2, hold_s=60)
    except PolicyEngineError:
        done.put("refused")
        return
    done.put("held")
    started.wait()  # hold the slot until the parent has counted


def test_processes_racing_for_two_slots(tmp_path: Path) -> None:
    db = str(tmp_path / "budget.sqlite")
    SqliteLeases(Path(db)).close()  # schema first, so the racers only race for slots
    ctx = multiprocessing.get_context("spawn")
    started, go, done = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(db, started, go, done)) for _ in range(6)]
    for p in procs:
        p.start()
    go.set()
    answers = sorted(done.get(timeout=60) for _ in procs)
    started.set()
    for p in procs:
        p.join(timeout=60)
    assert answers == ["held"] * 2 + ["refused"] * 4, answers


def _hold_forever(db: str, ready: Any) -> None:
    SqliteLeases(Path(db)).acquire("g", 1, hold_s=3600)
    ready.set()
    time.sleep(3600)


def test_a_killed_holder_does_not_leak_its_slot(tmp_path: Path) -> None:
    db = tmp_path / "budget.sqlite"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_forever, args=(str(db), ready))
    holder.start()
    assert ready.wait(60)
    leases = SqliteLeases(db)
    with pytest.raises(PolicyEngineError, match="concurrency"):
        leases.acquire("g", 1, hold_s=10)  # alive: its slot is held
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(timeout=30)
    lease = leases.acquire("g", 1, hold_s=10)  # the dead process's lease is dropped
    leases.release("g", lease)
    assert leases.held("g") == 0


def test_a_lease_of_another_host_frees_when_it_expires(tmp_path: Path) -> None:
    db = tmp_path / "budget.sqlite"
    leases = SqliteLeases(db)
    now_ms = int(time.time() * 1000)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO budget_leases VALUES ('g', 'x1', 'elsewhere', 1, '1', ?)",
                     (now_ms + 60_000,))
    with pytest.raises(PolicyEngineError):
        leases.acquire("g", 1, hold_s=10)  # pid 1 on another host: cannot tell, wait for expiry
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE budget_leases SET expires_ms = ? WHERE lease = 'x1'", (now_ms - 1,))
    leases.acquire("g", 1, hold_s=10)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_meter_threads_never_hold_more_than_the_limit(tmp_path: Path, kind: str) -> None:
    meter = MemoryBudgetMeter() if kind == "memory" else SqliteBudgetMeter(tmp_path / "b.sqlite")
    inside, peak, granted = [0], [0], [0]
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(20):
            try:
                lease = meter.acquire("g", 3, hold_s=30)
            except PolicyEngineError:
                continue
            with lock:
                inside[0] += 1
                granted[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.002)
            with lock:
                inside[0] -= 1
            meter.release("g", lease)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    meter.close()
    assert 1 <= peak[0] <= 3
    assert granted[0] > 3


def test_leases_of_an_earlier_schema_are_kept_and_still_count(tmp_path: Path) -> None:
    """The lease table became WITHOUT ROWID (one B-tree per write, issue 27); a database of an
    earlier version keeps the leases its live processes hold."""
    db = tmp_path / "budget.sqlite"
    now_ms = int(time.time() * 1000)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE budget_leases (grant_key TEXT NOT NULL, lease TEXT NOT NULL "
                     "PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, pid_start TEXT "
                     "NOT NULL, expires_ms INTEGER NOT NULL)")
        conn.execute("INSERT INTO budget_leases VALUES ('g', 'x1', 'elsewhere', 1, '1', ?)",
                     (now_ms + 60_000,))
    leases = SqliteLeases(db)
    assert leases.held("g") == 1
    with pytest.raises(PolicyEngineError, match="concurrency"):
        leases.acquire("g", 1, hold_s=10)
    lease = leases.acquire("g", 2, hold_s=10)
    leases.release("g", lease)
    leases.close()
    with sqlite3.connect(db) as conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'budget_leases'").fetchone()
    assert "WITHOUT ROWID" in sql[0]
    assert SqliteLeases(db).held("g") == 1  # opening again changes nothing
