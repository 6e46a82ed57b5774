"""The guard's step table: its names are the documented order, and a step that raises is a deny."""

from __future__ import annotations

import dis
import re
from typing import Any

import pytest

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard import Guard, guard, stages
from policy_engine.model import TmpAllocOp, TmpCapability
from tests.unit.guard_fixtures import NOW, make_profile, permit

NAMES = tuple(step.__name__ for step in stages.STEPS)


def test_the_table_is_the_documented_order() -> None:
    documented = re.findall(r"^\d+b?\. ``(\w+)``", guard.__doc__ or "", flags=re.MULTILINE)
    assert tuple(documented) == NAMES
    assert NAMES == ("kind", "expiry", "resolve", "forbids", "network", "permits", "limits",
                     "consent", "facts", "allow")


def test_decide_runs_the_table_in_its_order() -> None:
    # decide calls the steps unrolled (guard.py says why): the globals it loads, in order,
    # are the table's functions, each once
    loaded = [i.argval for i in dis.get_instructions(Guard.decide)
              if i.opname == "LOAD_GLOBAL" and i.argval in NAMES]
    assert tuple(loaded) == NAMES
    assert all(getattr(guard, n) is getattr(stages, n) for n in NAMES)


def tmp_profile() -> Any:
    return make_profile(capabilities=(permit("tmp.use", TmpCapability(max_bytes=100)),))


def test_every_step_runs_for_an_allow() -> None:
    ran: list[str] = []
    orig = {n: getattr(guard, n) for n in NAMES}
    mp = pytest.MonkeyPatch()
    try:
        for n in NAMES:
            def spy(call: stages.Call, n: str = n) -> Any:
                ran.append(n)
                return orig[n](call)
            mp.setattr(guard, n, spy)
        d = Guard().decide(tmp_profile(), TmpAllocOp(size_bytes=10), now_ms=NOW)
    finally:
        mp.undo()
    assert d.allowed
    assert tuple(ran) == NAMES


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("trace", [False, True])
def test_a_step_that_raises_is_a_deny(monkeypatch: pytest.MonkeyPatch, name: str,
                                      trace: bool) -> None:
    def broken(call: stages.Call) -> None:
        raise RuntimeError("a bug in a step")

    monkeypatch.setattr(guard, name, broken)
    d = Guard().decide(tmp_profile(), TmpAllocOp(size_bytes=10), now_ms=NOW, trace=trace)
    assert not d.allowed
    assert d.decision == "deny"
    assert d.code == ErrorCode.UNKNOWN_INTERNAL.value
    assert d.reason == "internal error in the guard"
    if trace:
        assert d.trace is not None
        assert [s.node for s in d.trace][-2:] == ["decision", "decision"]
        assert d.trace[-2].outcome == "fail"


@pytest.mark.parametrize("name", NAMES)
def test_a_step_refusing_by_raising_keeps_its_code(monkeypatch: pytest.MonkeyPatch,
                                                    name: str) -> None:
    def refusing(call: stages.Call) -> None:
        raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "refused inside a step")

    monkeypatch.setattr(guard, name, refusing)
    d = Guard().decide(tmp_profile(), TmpAllocOp(size_bytes=10), now_ms=NOW)
    assert d.decision == "deny"
    assert d.code == ErrorCode.CAPABILITY_BLOCKED.value
    assert d.reason == "refused inside a step"
