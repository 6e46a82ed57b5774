"""Refused before running costs nothing (issue 10 item 5): an executor that declares
``charges_at_start`` is charged one call when it calls ``ctx.started()``, not before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policy_engine.budget import grant_key
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import Budget, ExecResult, TmpAllocOp
from tests.unit.orchestrator_fixtures import MANIFEST, ScriptedExecutor, grant, orchestrator


class StartingExecutor(ScriptedExecutor):
    """Refuses before its start when ``refuse_early`` is set, else starts, then runs."""

    charges_at_start = True

    def __init__(self) -> None:
        super().__init__()
        self.refuse_early = False
        self.started_runs = 0

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        if self.refuse_early:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "refused before starting")
        ctx.started()
        self.started_runs += 1
        return super().execute(ctx, op)


class SilentExecutor(ScriptedExecutor):
    """Declares ``charges_at_start`` but never calls ``ctx.started()``."""

    charges_at_start = True


def test_a_refusal_before_the_start_consumes_no_call(tmp_path: Path) -> None:
    ex = StartingExecutor()
    g = grant(budget=Budget(calls=1))
    with orchestrator(tmp_path, ex) as orch:
        ex.refuse_early = True
        for _ in range(3):
            refused = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
            assert refused.result.code == "SANDBOX.CAPABILITY_BLOCKED"
            assert refused.result.used.calls == 0
            assert refused.end.budget_used.calls == 0
        assert orch.meter.used(grant_key(g)).get("calls", 0) == 0
        ex.refuse_early = False
        ran = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
        assert ran.result.ok, ran.result
        assert ran.result.used.calls == 1
        over = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
    assert over.result.code == "QUOTA.BUDGET_EXCEEDED"
    assert over.end.status == "denied"
    assert ex.started_runs == 1  # the call over budget never got past ctx.started()


def test_an_executor_that_never_says_it_started_is_charged_after(tmp_path: Path) -> None:
    ex = SilentExecutor()
    g = grant(budget=Budget(calls=1))
    with orchestrator(tmp_path, ex) as orch:
        first = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
        second = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
    assert first.result.ok
    assert first.result.used.calls == 1
    assert second.result.code == "QUOTA.BUDGET_EXCEEDED"  # its output is withheld


def test_an_executor_without_the_flag_is_charged_before_it_runs(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    ex.raise_exc = PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "refused")
    g = grant(budget=Budget(calls=1))
    with orchestrator(tmp_path, ex) as orch:
        first = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
        second = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
    assert first.result.used.calls == 1
    assert second.result.code == "QUOTA.BUDGET_EXCEEDED"
    assert ex.calls == 1

