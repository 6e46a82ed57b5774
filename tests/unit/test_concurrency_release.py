"""A concurrency slot comes back on every exit path of a call: success, a refusal, an exception
the executor raises, a timeout, a budget refusal (issue 10 item 7)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from policy_engine.budget import grant_key
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import SYSTEM_DEFAULT_LIMITS, Budget, TmpAllocOp
from tests.unit.orchestrator_fixtures import MANIFEST, ScriptedExecutor, grant, orchestrator
from tests.unit.orchestrator_fixtures import profile as make_profile


def one_slot(**kw: object) -> object:
    return make_profile(**kw).model_copy(  # type: ignore[arg-type]
        update={"limits": SYSTEM_DEFAULT_LIMITS.model_copy(update={"max_concurrency": 1})})


@pytest.mark.parametrize("meter", ["memory", "sqlite"])
def test_every_exit_path_releases_the_slot(tmp_path: Path, meter: str) -> None:
    ex = ScriptedExecutor()
    g = grant(budget=Budget(calls=6))
    with orchestrator(tmp_path, ex, prof=one_slot(timeout_ms=400),  # type: ignore[arg-type]
                      budget_meter=meter) as orch:
        ex.raise_exc = RuntimeError("executor bug")
        assert orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1)).result.code == \
            "TOOL.EXECUTION_FAILED"
        ex.raise_exc = PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "refused")
        assert orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1)).result.code == \
            "SANDBOX.CAPABILITY_BLOCKED"
        ex.raise_exc, ex.sleep_s = None, 2.0
        assert orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1)).result.code == "LLM.TIMEOUT"
        ex.sleep_s = 0.0
        for _ in range(3):
            assert orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1)).result.ok
        over = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))  # calls budget: 6 used
        assert over.result.code == "QUOTA.BUDGET_EXCEEDED"
        assert "calls" in (over.result.message or "")
        held = getattr(orch.meter, "held", None)
        if held is not None:
            assert held(grant_key(g)) == 0


def test_the_second_call_in_flight_is_refused_and_the_first_finishes(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    ex.sleep_s = 0.5
    g = grant()
    with orchestrator(tmp_path, ex, prof=one_slot()) as orch:  # type: ignore[arg-type]
        first: list[object] = []
        t = threading.Thread(target=lambda: first.append(
            orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))))
        t.start()
        while ex.calls == 0:
            threading.Event().wait(0.01)
        second = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
        t.join()
    assert second.result.code == "QUOTA.BUDGET_EXCEEDED"
    assert second.end.status == "denied"
    assert ex.calls == 1
    assert first[0].result.ok  # type: ignore[attr-defined]
