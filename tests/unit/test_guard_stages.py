"""The guard's step table: its names are the documented order, and a step that raises is a deny."""

from __future__ import annotations

import dis
import re
from typing import Any

import pytest

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard import Guard, chain, guard, stages
from policy_engine.guard.verdict import failed
from policy_engine.model import TmpAllocOp, TmpCapability
from tests.unit.guard_fixtures import NOW, make_profile, permit

NAMES = tuple(step.__name__ for step in stages.STEPS)


def test_the_table_is_the_documented_order() -> None:
    documented = re.findall(r"^\d+b?\. ``(\w+)``", guard.__doc__ or "", flags=re.MULTILINE)
    assert tuple(documented) == NAMES
    assert NAMES == ("kind", "resolve", "forbids", "network", "permits", "limits", "consent",
                     "facts", "allow")


def test_a_traced_call_runs_the_whole_table_in_its_order() -> None:
    # decide runs ``kind``, then the chain ``kind`` chose: traced, every step after it
    loaded = [i.argval for i in dis.get_instructions(Guard.decide)
              if i.opname == "LOAD_GLOBAL" and i.argval in NAMES]
    assert tuple(loaded) == ("kind",)
    assert guard.kind is stages.kind
    assert chain.NAMES == NAMES


def run_names(trace: bool, profile: Any = None, op: Any = None) -> tuple[list[str], Any]:
    """The steps one decision ran, in order (each step spied on where decide finds it)."""
    ran: list[str] = []
    mp = pytest.MonkeyPatch()
    try:
        spies = {}
        for n, step in zip(NAMES, stages.STEPS, strict=True):
            def spy(call: stages.Call, n: str = n, step: Any = step) -> Any:
                ran.append(n)
                return step(call)
            spies[n] = spy
        mp.setattr(guard, "kind", spies["kind"])
        mp.setattr(stages, "STEPS", tuple(spies.values()))
        d = Guard().decide(profile or tmp_profile(), op or TmpAllocOp(size_bytes=10),
                           now_ms=NOW, trace=trace)
    finally:
        mp.undo()
    return ran, d


def tmp_profile() -> Any:
    return make_profile(capabilities=(permit("tmp.use", TmpCapability(max_bytes=100)),))


def test_every_step_runs_for_a_traced_allow() -> None:
    ran, d = run_names(trace=True)
    assert d.allowed
    assert tuple(ran) == NAMES


def test_an_untraced_call_skips_only_the_steps_that_cannot_answer() -> None:
    # a tmp.alloc under a profile forbidding nothing, network on, consent not required: no
    # forbids, network or facts step (``chain.plan``), the rest in the table's order
    ran, d = run_names(trace=False)
    assert d.allowed
    assert ran == ["kind", "resolve", "permits", "limits", "allow"]
    ran, d = run_names(trace=False, op=TmpAllocOp(size_bytes=1000))
    assert not d.allowed
    assert d.code == ErrorCode.CAPABILITY_BLOCKED.value
    assert ran == ["kind", "resolve", "permits", "limits"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("trace", [False, True])
def test_a_step_that_raises_is_a_deny(monkeypatch: pytest.MonkeyPatch, name: str,
                                      trace: bool) -> None:
    def broken(call: stages.Call) -> None:
        raise RuntimeError("a bug in a step")

    planned, _ = run_names(trace=trace)
    patch_step(monkeypatch, name, broken)
    d = Guard().decide(tmp_profile(), TmpAllocOp(size_bytes=10), now_ms=NOW, trace=trace)
    if name not in planned:  # untraced, this call's chain skips it (it could not answer)
        assert not trace
        assert d.allowed
        return
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

    patch_step(monkeypatch, name, refusing)
    d = Guard().decide(tmp_profile(), TmpAllocOp(size_bytes=10), now_ms=NOW, trace=True)
    assert d.decision == "deny"
    assert d.code == ErrorCode.CAPABILITY_BLOCKED.value
    assert d.reason == "refused inside a step"


def patch_step(monkeypatch: pytest.MonkeyPatch, name: str, fn: Any) -> None:
    """Replace one step where decide finds it (``kind`` in guard, the rest in the table)."""
    if name == "kind":
        monkeypatch.setattr(guard, "kind", fn)
    monkeypatch.setattr(stages, "STEPS", tuple(fn if n == name else step for n, step
                                               in zip(NAMES, stages.STEPS, strict=True)))


@pytest.mark.parametrize("variant", ["plain", "cel"])
def test_an_untraced_chain_answers_as_the_whole_table(variant: str) -> None:
    # every case of the benchmark corpus (each domain; allows, forbids, permits refused,
    # limits, CEL conditions), with the disk facts off and on: the chain ``chain.plan``
    # picked answers exactly as running every step of the table, untraced
    from benchmarks.peers import common, policy_engine_peer

    cases = common.load_cases(variant)
    engine = policy_engine_peer.Engine(variant, cases)
    skipped = 0
    for g in (engine.guard, Guard(engine.policyset)):
        for case in cases:
            profile, op, now = engine.prepare(case)
            chained = g.decide(profile, op, now_ms=now)
            call = stages.Call.__new__(stages.Call)
            call.guard, call.profile, call.op, call.context = g, profile, op, None
            call.now_ms, call.tr = now, None
            assert stages.kind(call) is None
            skipped += len(NAMES) - 1 - len(call.run.__code__.co_names)
            try:
                whole = chain.plan(call.cp, call.kind, g.fs_facts, True)(call)
            except Exception as exc:  # noqa: BLE001 — decide's own answer to a step raising
                whole = failed(profile, exc, None)
            assert chained == whole, case
    assert skipped > 0  # the chains did leave steps out
