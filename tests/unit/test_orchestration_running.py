"""run_with_deadline: self-timed executors run inline, everything else in a watched thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from orchestrator_fixtures import profile

from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.executor import CancelToken, ExecContext, ExecutorCapabilities
from policy_engine.model import ExecResult, OpKind, TmpAllocOp
from policy_engine.orchestration.running import classify, run_with_deadline


class Recorder:
    name = "rec"
    capabilities = ExecutorCapabilities(op_kinds=frozenset(OpKind))

    def __init__(self, *, self_timed: bool, raise_timeout: bool = False) -> None:
        self.enforces_deadline = self_timed
        self.raise_timeout = raise_timeout
        self.thread: str | None = None

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        self.thread = threading.current_thread().name
        if self.raise_timeout:
            raise PolicyEngineError(ErrorCode.TIMEOUT, "process exceeded its wall-clock timeout")
        return ExecResult(ok=True, out={"n": 1})

    def close(self) -> None:
        """Nothing held."""


def ctx() -> ExecContext:
    return ExecContext(profile=profile(), deadline=time.monotonic() + 5)


def test_self_timed_executor_runs_inline_without_a_cancel_token() -> None:
    ex = Recorder(self_timed=True)
    attempt = run_with_deadline(ex, ctx(), TmpAllocOp(size_bytes=1), None)
    assert attempt.result is not None
    assert attempt.result.out == {"n": 1}
    assert ex.thread == threading.current_thread().name


def test_a_cancel_token_or_no_declaration_keeps_the_watched_thread() -> None:
    for ex, cancel in ((Recorder(self_timed=True), CancelToken()),
                       (Recorder(self_timed=False), None)):
        attempt = run_with_deadline(ex, ctx(), TmpAllocOp(size_bytes=1), cancel)
        assert attempt.result is not None
        assert ex.thread is not None
        assert ex.thread.startswith("policy-engine-exec-")


def test_inline_timeout_is_classified_like_the_threaded_one() -> None:
    attempt = run_with_deadline(Recorder(self_timed=True, raise_timeout=True), ctx(),
                                TmpAllocOp(size_bytes=1), None)
    assert attempt.error is not None
    assert attempt.error.code == ErrorCode.TIMEOUT
    assert attempt.timed_out
    assert attempt.error_kind == "timeout"


class Stuck(Recorder):
    """Ignores its token: blocks until released."""

    def __init__(self) -> None:
        super().__init__(self_timed=False)
        self.release = threading.Event()

    def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
        self.thread = threading.current_thread().name
        self.release.wait(30)
        return ExecResult(ok=True, out={})


def test_watched_threads_are_reused_and_a_stuck_one_is_not_waited_for() -> None:
    idents = []

    class Ident(Recorder):
        def execute(self, ctx: ExecContext, op: Any) -> ExecResult:
            idents.append(threading.get_ident())
            return super().execute(ctx, op)

    for _ in range(3):
        attempt = run_with_deadline(Ident(self_timed=False), ctx(), TmpAllocOp(size_bytes=1),
                                    None)
        assert attempt.result is not None
    assert len(set(idents)) == 1, idents  # one worker thread served the three calls
    stuck = Stuck()
    late = ExecContext(profile=profile(), deadline=time.monotonic() + 0.2)
    attempt = run_with_deadline(stuck, late, TmpAllocOp(size_bytes=1), None, grace_s=0.1)
    assert attempt.timed_out
    assert attempt.error is not None
    assert attempt.error.code == ErrorCode.TIMEOUT
    # the stuck thread still holds its job: the next call runs on another one, at once
    attempt = run_with_deadline(Ident(self_timed=False), ctx(), TmpAllocOp(size_bytes=1), None)
    assert attempt.result is not None
    assert idents[-1] != idents[0]  # the stuck job kept the reused worker
    stuck.release.set()


def test_a_backends_own_refusal_is_classified_as_the_backends() -> None:
    """An executor's ``BackendRefusal`` is recorded as a refused selection is (``capability``,
    so the refusal says ``backend``); a plain ``CAPABILITY_BLOCKED`` (a second-line policy
    re-check) stays the policy's, and a backend failure keeps its own kind."""
    blocked = BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, "no live interpreter here")
    assert classify(blocked, "docker") == (blocked, "capability")
    recheck = PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "env not listed")
    assert classify(recheck, "docker") == (recheck, "policy")
    down = BackendRefusal(ErrorCode.PROVIDER_UNAVAILABLE, "daemon gone")
    assert classify(down, "docker") == (down, "provider")
