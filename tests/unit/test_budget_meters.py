"""Budget meters (memory, SQLite): check-and-consume semantics and the grant key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.budget_memory import MemoryBudgetMeter
from plugins.budget_sqlite import SqliteBudgetMeter
from policy_engine.budget import BudgetMeter, grant_key, limit_of
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import Budget, Grant


@pytest.fixture(params=["memory", "sqlite"])
def meter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BudgetMeter]:
    m: BudgetMeter = (MemoryBudgetMeter() if request.param == "memory"
                      else SqliteBudgetMeter(tmp_path / "budget.sqlite"))
    yield m
    m.close()


def test_consumes_up_to_the_limit_then_refuses_without_consuming(meter: BudgetMeter) -> None:
    assert meter.check_and_consume("g", "bytes_out", 60, 100) == 60
    assert meter.check_and_consume("g", "bytes_out", 40, 100) == 100
    with pytest.raises(PolicyEngineError) as info:
        meter.check_and_consume("g", "bytes_out", 1, 100)
    assert info.value.code == ErrorCode.BUDGET_EXCEEDED
    assert info.value.audit == {"grant_key": "g", "kind": "bytes_out", "limit": 100,
                                "used": 100, "amount": 1}
    assert meter.used("g") == {"bytes_out": 100}
    assert meter.check_and_consume("g", "calls", 5, None) == 5  # None = unlimited
    assert meter.used("other") == {}


def test_refuses_unknown_kinds_and_negative_amounts(meter: BudgetMeter) -> None:
    with pytest.raises(ValueError, match="unknown budget kind `tokens`"):
        meter.check_and_consume("g", "tokens", 1, None)
    with pytest.raises(ValueError, match="must be >= 0"):
        meter.check_and_consume("g", "calls", -1, None)
    assert meter.used("g") == {}


def test_sqlite_meter_is_shared_through_the_file(tmp_path: Path) -> None:
    first = SqliteBudgetMeter(tmp_path / "b.sqlite")
    second = SqliteBudgetMeter(tmp_path / "b.sqlite")
    first.check_and_consume("g", "calls", 2, 3)
    with pytest.raises(PolicyEngineError):
        second.check_and_consume("g", "calls", 2, 3)
    assert second.used("g") == {"calls": 2}
    first.close()
    second.close()


def test_grant_key_prefers_the_decision_fingerprint() -> None:
    plain = Grant(tenant="acme", subject_id="agent:1", tool_name="t", call_id="c9", expires_at=0)
    assert grant_key(plain) == "acme/agent:1/c9"
    assert grant_key(plain.model_copy(update={"decision_key_fingerprint": "fp"})) == "fp"
    assert limit_of(Budget(cpu_ms=7), "cpu_ms") == 7
    assert limit_of(Budget(), "gpu_ms") is None
