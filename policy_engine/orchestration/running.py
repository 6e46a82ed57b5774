"""Runs one executor call under a wall deadline and a cancel token, and classifies the outcome."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.executor import CancelToken, ExecContext, Executor
from policy_engine.model import ExecOp, ExecResult, OpKind
from policy_engine.pid import current as current_pid

log = logging.getLogger(__name__)

# How often the waiting thread looks at the caller's cancel token; the executor itself is woken
# at once through its own token.
_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Attempt:
    """What came back from one executor call.

    :param error: set when the call failed; its code is already the registry mapping.
    :param error_kind: ``sandbox_error_kind`` of the evidence (``timeout``, ``cancelled``,
        ``exception``, or the error code's family such as ``policy``/``quota``/``provider``).
    """

    result: ExecResult | None
    error: PolicyEngineError | None
    error_kind: str | None
    timed_out: bool = False


def _kind_of(code: ErrorCode) -> str:
    return {
        ErrorCode.TIMEOUT: "timeout",
        ErrorCode.BUDGET_EXCEEDED: "quota",
        ErrorCode.PROVIDER_UNAVAILABLE: "provider",
        ErrorCode.EXECUTION_FAILED: "execution",
        ErrorCode.NOT_FOUND: "not_found",
        ErrorCode.SCHEMA_VALIDATION_FAILED: "schema",
        ErrorCode.UNKNOWN_INTERNAL: "internal",
    }.get(code, "policy")


def classify(exc: BaseException, backend: str) -> tuple[PolicyEngineError, str]:
    """Map an executor exception to a registry error and an error kind.

    A ``PolicyEngineError`` keeps its code. Anything else is ``TOOL.EXECUTION_FAILED`` with a
    public reason naming only the backend: the exception text can hold paths, hosts or data, so
    it goes to the audit detail and the log, never to the public message.
    """
    if isinstance(exc, PolicyEngineError):
        kind = _kind_of(exc.code)
        # the backend's own no (not a re-check of the policy): recorded as a refused backend
        # selection is, so the refusal says `backend` (gateway/outcome.py)
        return exc, "capability" if isinstance(exc, BackendRefusal) and kind == "policy" \
            else kind
    err = PolicyEngineError(
        ErrorCode.EXECUTION_FAILED, f"backend `{backend}` failed",
        audit={"backend": backend, "exception": type(exc).__name__, "message": str(exc)})
    return err, "exception"


class _Workers:
    """Idle executor threads, reused: starting a thread per call cost ≈ 0.1 ms of CPU and up to
    a millisecond of scheduling on a busy host (issue 27). A worker takes one job at a time and
    goes back to the idle list when it returns; a job that never returns (an executor ignoring
    its token past the grace period) keeps its thread, as a fresh thread would have been kept,
    and the next call gets another. At most ``MAX_IDLE`` wait; the rest end.
    """

    MAX_IDLE = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._pid = current_pid()

    def run(self, job: Callable[[], None]) -> None:
        """Start ``job`` on an idle worker, or on a new one."""
        with self._lock:
            if self._pid != current_pid():  # forked: the parent's threads do not exist here
                self._idle, self._pid = [], current_pid()
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), daemon=True,
                             name="policy-engine-exec").start()
        inbox.put(job)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()  # INVARIANT: a job never raises (``work`` catches everything)
            with self._lock:
                if len(self._idle) >= self.MAX_IDLE or self._pid != current_pid():
                    return
                self._idle.append(inbox)


_WORKERS = _Workers()


def run_with_deadline(executor: Executor, ctx: ExecContext, op: ExecOp,
                      cancel: CancelToken | None, *, grace_s: float = 1.0,
                      inline: bool = False) -> Attempt:
    """Call ``executor.execute(ctx, op)`` in a worker thread and wait until it returns, the
    deadline ``ctx.deadline`` passes (``LLM.TIMEOUT``) or ``cancel`` fires.

    Why a thread: the deadline must hold even for an executor that never looks at its token.
    On timeout or cancellation the executor's token is cancelled and it gets ``grace_s`` to stop
    and clean up; a thread cannot be killed, so one that ignores its token is left to finish in
    the background (it is a daemon) while the call is reported as timed out or cancelled.

    An executor that declares ``enforces_deadline = True`` (it stops at ``ctx.deadline`` and on
    ``ctx.cancel`` by itself, e.g. by killing its process group) runs in the calling thread when
    the caller passed no cancel token: a thread handoff costs ~1 ms of scheduling latency on a
    busy host, and there is nothing for a watching thread to do. So does a call its executor's
    ``stops_by_itself(kind, root_fs)`` vouches for (the fs executor's reads and listings on
    local file systems). ``inline``: the caller asked ``stops_by_itself`` of this executor, kind
    and root just before, in this thread, and was told yes (``Orchestrator.run``'s
    ``on_caller``): not asked again.

    Cancellation maps to ``TOOL.EXECUTION_FAILED`` with reason "cancelled": the registry has no
    cancel code, ``LLM.TIMEOUT`` would tell retry logic and dashboards a deadline fired when none
    did, and "the call did not complete, retrying may succeed" is what EXECUTION_FAILED means.
    """
    if cancel is None and (inline or stops_by_itself(executor, OpKind(op.kind),
                                                     ctx.profile.mappings.root_fs)):
        return _run_inline(executor, ctx, op)
    box: dict[str, object] = {}
    done = threading.Event()

    def work() -> None:
        threading.current_thread().name = f"policy-engine-exec-{executor.name}"
        try:
            box["result"] = executor.execute(ctx, op)
        except BaseException as exc:  # everything must reach the waiting thread
            box["exc"] = exc
        finally:
            done.set()

    _WORKERS.run(work)
    timed_out = cancelled = False
    while not done.is_set():
        remaining = ctx.deadline - time.monotonic()
        if cancel is not None and cancel.cancelled:
            cancelled = True
        elif remaining <= 0:
            timed_out = True
        if timed_out or cancelled:
            ctx.cancel.cancel("timeout" if timed_out else (cancel.reason if cancel else None)
                              or "cancelled")
            if not done.wait(grace_s):
                log.warning("executor `%s` ignored its cancel token for %.1fs", executor.name,
                            grace_s)
            break
        done.wait(min(_POLL_S, remaining) if cancel is not None else remaining)
    own = box.get("exc")
    if timed_out and isinstance(own, PolicyEngineError) and own.code == ErrorCode.TIMEOUT:
        # the executor's own timeout fired at the same deadline: its message says which part
        timed_out = False
    if timed_out:
        return Attempt(None, PolicyEngineError(
            ErrorCode.TIMEOUT, "the call exceeded its time limit",
            audit={"backend": executor.name}), "timeout", timed_out=True)
    if cancelled:
        return Attempt(None, PolicyEngineError(
            ErrorCode.EXECUTION_FAILED, "cancelled",
            audit={"backend": executor.name, "reason": cancel.reason if cancel else None}),
            "cancelled")
    exc = box.get("exc")
    if isinstance(exc, BaseException):
        err, kind = classify(exc, executor.name)
        return Attempt(None, err, kind, timed_out=err.code == ErrorCode.TIMEOUT)
    result = box.get("result")
    if not isinstance(result, ExecResult):
        return Attempt(None, PolicyEngineError(
            ErrorCode.EXECUTION_FAILED, f"backend `{executor.name}` returned no result",
            audit={"returned": type(result).__name__}), "exception")
    return Attempt(result, None, None)


def stops_by_itself(executor: Executor, kind: OpKind, root_fs: str) -> bool:
    """Whether ``executor`` ends a ``kind`` call beneath ``root_fs`` by its deadline without
    a watching thread: it ``enforces_deadline``, or its ``stops_by_itself`` vouches for it."""
    if getattr(executor, "enforces_deadline", False) is True:
        return True
    vouch = getattr(executor, "stops_by_itself", None)
    return callable(vouch) and vouch(kind, root_fs) is True


def _run_inline(executor: Executor, ctx: ExecContext, op: ExecOp) -> Attempt:
    """The same classification as the threaded path, for a self-timed executor."""
    try:
        result = executor.execute(ctx, op)
    except Exception as exc:  # BaseException (KeyboardInterrupt…) belongs to the caller here
        err, kind = classify(exc, executor.name)
        return Attempt(None, err, kind, timed_out=err.code == ErrorCode.TIMEOUT)
    if not isinstance(result, ExecResult):
        return Attempt(None, PolicyEngineError(
            ErrorCode.EXECUTION_FAILED, f"backend `{executor.name}` returned no result",
            audit={"returned": type(result).__name__}), "exception")
    return Attempt(result, None, None)
