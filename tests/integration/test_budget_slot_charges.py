"""A slot taken with a charge, and given back with charges, in one step of the SQLite meter's
shared table (issue 27: a contained read's slot with its `calls`, and back with its
`bytes_in`): both or neither, exact across real processes, in the table and for keys too long
for it (the database), and through the orchestrator: refusals, withheld output, slots back.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from plugins.budget_sqlite import SqliteBudgetMeter
from plugins.budget_sqlite.shared import KEY_MAX
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.errors import PolicyEngineError
from policy_engine.model import FsReadOp, Grant, Manifest, Settings
from policy_engine.orchestrator import Orchestrator

pytestmark = pytest.mark.integration
SPAWN = multiprocessing.get_context("spawn")  # fresh interpreters: nothing shared but files
KEYS = pytest.mark.parametrize("key", ["g", "k" * (KEY_MAX + 10)], ids=["table", "long-key"])


def _refusal(exc: pytest.ExceptionInfo[PolicyEngineError]) -> str:
    return str(exc.value.audit.get("kind"))


@KEYS
def test_both_or_neither(tmp_path: Path, key: str) -> None:
    meter = SqliteBudgetMeter(tmp_path / "budget.sqlite")
    try:
        first = meter.acquire_charging(key, 2, hold_s=60, kind="calls", amount=1,
                                       charge_limit=2)
        meter.acquire_charging(key, 2, hold_s=60, kind="calls", amount=1, charge_limit=5)
        with pytest.raises(PolicyEngineError) as over_slots:  # no slot: nothing charged
            meter.acquire_charging(key, 2, hold_s=60, kind="calls", amount=1, charge_limit=5)
        assert _refusal(over_slots) == "concurrency"
        assert meter.used(key)["calls"] == 2
        meter.release_charging(key, first, [("bytes_in", 10, 100)])
        with pytest.raises(PolicyEngineError) as over_calls:  # no charge: no slot taken
            meter.acquire_charging(key, 2, hold_s=60, kind="calls", amount=1, charge_limit=2)
        assert _refusal(over_calls) == "calls"
        third = meter.acquire_charging(key, 2, hold_s=60, kind="calls", amount=1,
                                       charge_limit=3)
        assert meter.used(key) == {"calls": 3, "bytes_in": 10}
        with pytest.raises(PolicyEngineError) as over_bytes:  # refused: the slot still back
            meter.release_charging(key, third, [("bytes_in", 91, 100)])
        assert _refusal(over_bytes) == "bytes_in"
        assert meter.used(key) == {"calls": 3, "bytes_in": 10}
        # one slot is held (the second), one free: a call takes it, the next is refused
        meter.acquire(key, 2, hold_s=60)
        with pytest.raises(PolicyEngineError):
            meter.acquire(key, 2, hold_s=60)
    finally:
        meter.close()


def _race(db: str, key: str, go: Any, answers: Any, hold: Any) -> None:
    meter = SqliteBudgetMeter(Path(db))
    go.wait()
    try:
        lease = meter.acquire_charging(key, 2, hold_s=60, kind="calls", amount=1,
                                       charge_limit=5)
    except PolicyEngineError as exc:
        answers.put(str(exc.audit.get("kind")))
        return
    answers.put("held")
    hold.wait()  # hold the slot until the parent has counted
    meter.release_charging(key, lease, [("bytes_in", 7, None)])
    meter.close()


@KEYS
def test_processes_racing_for_two_slots_charge_exactly_the_two(tmp_path: Path,
                                                               key: str) -> None:
    db = tmp_path / "budget.sqlite"
    SqliteBudgetMeter(db).close()
    go, hold, answers = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=_race, args=(str(db), key, go, answers, hold))
             for _ in range(6)]
    for p in procs:
        p.start()
    go.set()
    got = sorted(answers.get(timeout=60) for _ in procs)
    hold.set()
    for p in procs:
        p.join(timeout=60)
    assert got == ["concurrency"] * 4 + ["held"] * 2, got
    meter = SqliteBudgetMeter(db)
    try:
        assert meter.used(key) == {"calls": 2, "bytes_in": 14}
        for _ in range(2):  # both slots came back
            meter.acquire(key, 2, hold_s=60)
    finally:
        meter.close()


POLICY = """policy "t/slot-charges" version "1.0.0"
defaults {{ limits {{ concurrency 1 }} }}
permit "read" fs.read paths ["{ws}/**"]
"""


def _world(tmp_path: Path) -> tuple[Path, Orchestrator]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_bytes(b"x" * 100)
    (tmp_path / "p.sbpolicy").write_text(POLICY.format(ws=ws))
    return ws, Orchestrator(compile_files([tmp_path / "p.sbpolicy"]),
                            config=EngineConfig(state_dir=tmp_path / "state",
                                                revocation="memory"))


def _grant(ws: Path, **budget: int) -> Grant:
    return Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "r", "call_id": "c1",
        "expires_at": 4102444800000, "budget": budget,
        "capabilities": [{"kind": "fs.read", "paths": [f"{ws}/**"]}]})


def _manifest(ws: Path) -> Manifest:
    return Manifest.model_validate({"name": "r", "version": "1", "side_effects": ["Read"],
                                    "permissions": [{"kind": "fs.read", "paths": [f"{ws}/**"]}]})


def test_a_read_over_its_bytes_budget_is_withheld_and_gives_its_slot_back(
        tmp_path: Path) -> None:
    ws, orch = _world(tmp_path)
    with orch:
        grant, manifest = _grant(ws, bytes_in=150), _manifest(ws)
        run = [orch.run(grant, manifest, FsReadOp(path=f"{ws}/a.txt"),
                        settings=Settings(root_fs=str(ws))) for _ in range(3)]
        assert run[0].result.ok
        assert run[0].result.used.bytes_in == 100
        for over in run[1:]:  # concurrency 1: each got the slot the one before gave back
            assert over.result.code == "QUOTA.BUDGET_EXCEEDED", over.result
            assert "bytes_in" in (over.result.message or "")
            assert over.result.out == {}
            assert over.end.status == "error"
            assert over.end.sandbox_error_kind == "quota"
            assert over.end.budget_used.calls == 1
            assert over.end.budget_used.bytes_in == 0
        assert orch.meter.used("t/agent:a/c1") == {"calls": 3, "bytes_in": 100}
        other = SqliteBudgetMeter(tmp_path / "state" / "budget.sqlite")
        try:  # the slot is free: another process takes the grant's only one
            other.acquire("t/agent:a/c1", 1, hold_s=60)
        finally:
            other.close()


def test_a_read_refused_for_its_calls_or_its_slot_is_charged_nothing(tmp_path: Path) -> None:
    ws, orch = _world(tmp_path)
    with orch:
        grant, manifest = _grant(ws, calls=1), _manifest(ws)
        settings = Settings(root_fs=str(ws))
        assert orch.run(grant, manifest, FsReadOp(path=f"{ws}/a.txt"), settings=settings
                        ).result.ok
        no_calls = orch.run(grant, manifest, FsReadOp(path=f"{ws}/a.txt"), settings=settings)
        assert no_calls.result.code == "QUOTA.BUDGET_EXCEEDED"
        assert "calls" in (no_calls.result.message or "")
        assert no_calls.end.status == "denied"
        held = SqliteBudgetMeter(tmp_path / "state" / "budget.sqlite")  # another process's
        try:
            lease = held.acquire("t/agent:a/c2", 1, hold_s=60)
            other = _grant(ws).model_copy(update={"call_id": "c2"})
            busy = orch.run(other, manifest, FsReadOp(path=f"{ws}/a.txt"), settings=settings)
            assert busy.result.code == "QUOTA.BUDGET_EXCEEDED"
            assert "concurrency" in (busy.result.message or "")
            assert busy.end.budget_used.calls == 0
            held.release("t/agent:a/c2", lease)
            assert orch.run(other, manifest, FsReadOp(path=f"{ws}/a.txt"), settings=settings
                            ).result.ok
        finally:
            held.close()
        assert orch.meter.used("t/agent:a/c1")["calls"] == 1
        assert orch.meter.used("t/agent:a/c2") == {"calls": 1, "bytes_in": 100}
