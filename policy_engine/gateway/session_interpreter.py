"""A session's stateful interpreter: one live Python process inside the session's sandbox,
started on the first stateful call, fed each later one, restarted on demand, after a crash, a
timeout, a cancel or a policy change, and killed at the session's end (docs/sessions.md).

Each stateful call is decided by the gateway like the plain run_code of the same code (its
decision, consent, budget and evidence begin/end); only the execution differs: the executor
the call selected is asked for its live interpreter (``start_interpreter``: proc-bwrap, and docker
in pool mode, plugins/executor_docker/interpreter.py), and the
decided code runs there. A call that finds the previous interpreter gone says so
(``interpreter.state_lost``) and starts a fresh one; nothing is ever replaced mid-call.

The interpreter's sandbox keeps the masks its start planned. Before each call the live one
plans the masks that call's plain twin would get (``stale``: the cached planning, about a
millisecond); when they differ (a denied path appeared since, or went) it is ended and a fresh
one starts under the new ones, reported like any restart (``the masks changed``): code never
runs in a sandbox that shows what a plain call of it would have masked (attack 35, F1).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, Executor
from policy_engine.model import ExecOp, ExecResult, Limits, ProcExecOp, Profile

Record = Callable[[str, dict[str, Any]], None]
"""Writes a lifecycle event of the session (``interpreter_started``, ``interpreter_ended``)."""


class LiveInterpreter(Protocol):
    """What an executor's ``start_interpreter`` returns (plugins/executor_proc/interpreter.py,
    plugins/executor_docker/interpreter.py)."""

    ended: str | None
    info: dict[str, Any]

    @property
    def pid(self) -> int: ...

    def call(self, ctx: ExecContext, op: ProcExecOp, code: str) -> ExecResult: ...

    def stale(self, ctx: ExecContext, op: ProcExecOp) -> str | None: ...

    def close(self, reason: str) -> bool: ...


class SessionInterpreter:
    """The interpreter slot of one session: at most one live process, one call at a time.

    :param record: the session's event log (starts, restarts and ends with their reason).
    :param lifetime_s: the interpreter's CPU-time backstop (its rlimit is lifetime × cores).
    """

    def __init__(self, record: Record, lifetime_s: float) -> None:
        self.record = record
        self.lifetime_s = lifetime_s
        self.lock = threading.Lock()  # held by the session for a whole call
        self._busy = threading.Lock()  # held by the worker running the call
        self.live: LiveInterpreter | None = None
        self.profile_hash = ""
        self.generation = 0
        self.lost: str | None = None  # why the previous interpreter ended, for the next call
        self.closed = False

    def via(self, selected: Executor) -> Executor:
        """The orchestrator's ``via``: runs the decided op in this session's interpreter."""
        return _Via(self, selected)

    def restart(self, reason: str) -> dict[str, Any]:
        """Kill the live interpreter now (if any); the next stateful call starts a fresh one
        and reports ``reason``."""
        with self.lock:
            was = self._end(reason)
        return {"killed": was is not None, "pid": was, "reason": reason}

    def close(self, reason: str) -> int | None:
        """The session ended: kill the interpreter; no call starts another. Its pid or None."""
        self.closed = True
        with self.lock:
            return self._end(reason)

    def _end(self, reason: str) -> int | None:
        live, self.live = self.live, None
        if live is None:
            return None
        live.close(reason)
        self.lost = reason
        self.record("interpreter_ended", {"generation": self.generation, "pid": live.pid,
                                          "reason": reason})
        return live.pid

    def run(self, selected: Executor, ctx: ExecContext, op: ExecOp) -> ExecResult:
        """One call (the session holds ``self.lock``). Serialised on its own as well: the
        orchestrator stops waiting for a killed call after a grace period, and the next call
        must not start while the previous one's worker is still tearing its interpreter down."""
        with self._busy:
            return self._run(selected, ctx, op)

    def _run(self, selected: Executor, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if not isinstance(op, ProcExecOp) or op.tool != "python3" or len(op.args) != 2 \
                or op.args[0] != "-c":
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    "a stateful call runs `python3 -c <code>`")
        start = getattr(selected, "start_interpreter", None)
        if start is None:
            raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"{selected.name} keeps no "
                                 "live interpreter (stateful sessions: proc-bwrap, docker)")
        if self.closed:
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "the session ended")
        if self.live is not None and self.live.ended is not None:
            self._end(f"it died between calls: {self.live.ended}")
        key = sandbox_key(ctx.profile, ctx.limits)
        if self.live is not None and self.profile_hash != key:
            # what runs is what was decided: never old code's process under a new profile
            self._end(f"the profile changed ({self.profile_hash[:12]} -> {key[:12]}): "
                      "the interpreter was restarted under the new one")
        if self.live is not None:
            masks = self.live.stale(ctx, op)
            if masks is not None:
                self._end(f"the masks changed ({masks}): the interpreter was restarted under "
                          "the new ones")
        fresh = self.live is None
        if self.live is None:
            t0 = time.monotonic()
            self.live = start(ctx, op, self.lifetime_s)
            self.generation += 1
            self.profile_hash = key
            self.record("interpreter_started", {
                "generation": self.generation, "pid": self.live.pid,
                "profile_hash": self.profile_hash, "after": self.lost,
                "start_ms": int((time.monotonic() - t0) * 1000), **self.live.info})
        note = {"generation": self.generation, "fresh": fresh,
                "state_lost": self.lost if fresh and self.generation > 1 else None}
        self.lost = None
        live = self.live
        try:
            result = live.call(ctx, op, op.args[1])
        except PolicyEngineError as exc:
            if live.ended is not None:
                self._end(f"the previous call ended it: {live.ended}")
            exc.audit = {**(exc.audit or {}), "interpreter": {**note, "ended": live.ended}}
            raise
        if live.ended is not None:  # a crash mid-call: reported now, replaced on the next
            self._end(f"the previous call crashed it: {live.ended}")
            note["crashed"] = live.ended
        if isinstance(result.out, dict):
            result.out["interpreter"] = note
        return result


def sandbox_key(profile: Profile, limits: Limits) -> str:
    """The digest of what shapes the interpreter's sandbox: the profile and the decision's
    limits without what each call has of its own (call id, expiry, consent, the wall timeout).
    Two calls with one key would get the same bubblewrap plan, limits and filters."""
    doc = profile.model_dump(mode="json", exclude=_PER_CALL)
    doc["limits"].pop("timeout_ms", None)
    doc["decided_limits"] = limits.model_dump(mode="json", exclude={"timeout_ms"})
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


_PER_CALL = {"call_id", "expires_at", "consent", "consent_required", "timeout_ms",
             "profile_hash", "limit_layers", "policy_version", "policy_version_hash"}


class _Via:
    """The selected executor's stand-in for one stateful call (same name: the evidence says
    which backend ran it)."""

    enforces_deadline = True  # the interpreter's wait kills it at the deadline or cancel
    charges_at_start = True

    def __init__(self, slot: SessionInterpreter, selected: Executor) -> None:
        self.slot, self.selected = slot, selected
        self.name = selected.name
        self.capabilities = selected.capabilities

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        return self.slot.run(self.selected, ctx, op)

    def close(self) -> None:
        """Nothing of its own: the selected executor outlives the call."""
