"""A live Python interpreter inside a proc-bwrap sandbox: started once under a call's plan,
fed one call's code at a time over a framed pipe protocol (``interpreter_server.py``).

The process is spawned exactly as a call of that profile would be (its bubblewrap plan, layer 2
Landlock + seccomp, its cgroup's memory, pids and cpu quota, rlimits) and lives on between
calls; each call gets its own wall deadline, its own captured (and streamed) output and its own
CPU charge (the cgroup's delta). A call that times out or is cancelled kills the process group
and the cgroup; one that ends the process (``os._exit``, a signal, the OOM killer) is reported
as a crash. Either way the process is gone and never silently replaced mid-call.

Its mount namespace is the one its start planned: a path the masks cover now but did not then
(a ``.env`` the host wrote since) is not hidden in it. Each call therefore plans again, as its
plain twin would (:meth:`InterpreterProcess.stale`: the cached planning, ~1 ms), and the
session restarts the interpreter when the masks differ (attack 35, F1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import selectors
import signal
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from plugins.executor_proc import cgroups, owner, sanitize, status_pipe
from plugins.executor_proc.interpreter_masks import (
    MaskKey,
    changed,
    mask_key,
    server_op,
)
from plugins.executor_proc.limits import describe
from plugins.executor_proc.spec import Limits, Plan, resolve_limits
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.capture import HeadTail
from policy_engine.errors import BackendRefusal
from policy_engine.executor import ExecContext
from policy_engine.guard.binds import bound_paths
from policy_engine.model import (
    Digest,
    ExecResult,
    NetworkMode,
    ProcExecOp,
    SideEffect,
    SideEffectRec,
    Usage,
)

if TYPE_CHECKING:
    import subprocess

    from plugins.executor_proc.executor import ProcExecutor

MAX_FRAME = 1 << 20  # a reply frame is a small JSON document; more is a broken peer
MAX_CODE = 16 << 20  # the server's own cap on a call's code
_HEAD = struct.Struct(">cI")


class InterpreterProcess:
    """One live interpreter; :meth:`call` runs one call at a time (the caller serialises).

    ``ended`` is ``None`` while it lives, else why it ended (``timed out``, ``crashed (exit
    code 3)``, ``closed: ...``): the session reports it on the next call.
    """

    def __init__(self, proc: subprocess.Popen[bytes], cg: cgroups.ExecCgroup | None,
                 pool: cgroups.CgroupPool | None, status_r: int, channel: socket.socket,
                 plan: Plan, executor: ProcExecutor, layered: bool) -> None:
        self.proc, self.cg, self.pool, self.plan = proc, cg, pool, plan
        self.executor, self.layered = executor, layered
        self.status_r, self.channel = status_r, channel
        self.status = bytearray()
        self.buf = bytearray()
        self.ended: str | None = None
        self.info: dict[str, Any] = {}
        self.exit_code: int | None = None
        self.oom_kills = 0
        self.masks: MaskKey = frozenset()  # what its namespace was built with (start's)
        self._lock = threading.Lock()
        assert proc.stdout is not None
        assert proc.stderr is not None
        self.c, self.r, self.e = channel.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        for fd in (self.c, self.r, self.e, status_r):
            os.set_blocking(fd, False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.ended is None

    # --- the calls ---------------------------------------------------------------------------

    def stale(self, ctx: ExecContext, op: ProcExecOp) -> str | None:
        """How the masks a plain call of ``op`` would get now differ from the ones this
        interpreter's namespace was built with (``None``: the same). Any difference counts,
        a mask gone as well: a namespace cannot be shown to equal a plan it was not built from.

        :raises PolicyEngineError: the plan is refused now (the plain call would be too).
        """
        plan = self.executor._plan(ctx, server_op(op), "/tmp")
        return changed(self.masks, mask_key(plan))


    def wait_ready(self, ctx: ExecContext) -> None:
        """Wait for the server's ``R`` frame within the call's deadline.

        :raises PolicyEngineError: the sandbox could not be set up or the server died first.
        """
        err = HeadTail(4096)
        got = self._exchange(b"", ctx, ctx.deadline, HeadTail(4096), err, until=b"R")
        if got is None:
            why = err.kept(mark=False).decode(errors="replace")[:300]
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "the interpreter could not "
                                    f"start in the sandbox ({self.ended}): {why}")
        self.info = _json(got)

    def call(self, ctx: ExecContext, op: ProcExecOp, code: str) -> ExecResult:
        """Run ``code`` (the decided op's) in the interpreter under ``ctx``'s deadline.

        :raises PolicyEngineError: ``LLM.TIMEOUT`` (deadline or cancel: the interpreter was
            killed), ``QUOTA.BUDGET_EXCEEDED`` (the memory cgroup's OOM killer ended it).
        """
        lim = resolve_limits(ctx.profile, op, ctx.limits)
        data = code.encode("utf-8", "surrogatepass")
        if len(data) > MAX_CODE:
            raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"the code is {len(data)} "
                                 f"bytes; a stateful call takes at most {MAX_CODE}")
        ctx.started()  # idempotent: the first call's spawn already said it
        # frames a thread of an earlier call wrote after its end belong to no call: dropped
        # (bounded), so a stale `D` cannot end this call before it ran
        self.buf.clear()
        for _ in range(64):
            if not _read(self.c):
                break
        out, err = HeadTail(lim.max_stdout), HeadTail(lim.max_stderr)
        start, cpu0 = time.monotonic(), self._cpu_ms()
        deadline = min(ctx.deadline, start + lim.timeout_s)
        done = self._exchange(_HEAD.pack(b"C", len(data)) + data, ctx, deadline, out, err,
                              until=b"D")
        duration_ms = int((time.monotonic() - start) * 1000)
        cpu_ms = max(0, (self._cpu_ms() or 0) - (cpu0 or 0))
        audit = {"backend": self.executor.name, "duration_ms": duration_ms, "cpu_ms": cpu_ms,
                 "stdout": out.digest().model_dump(), "stderr": err.digest().model_dump(),
                 "interpreter": {"pid": self.pid, "ended": self.ended}}
        if done is None and self.ended in ("timed out", "cancelled"):
            raise PolicyEngineError(ErrorCode.TIMEOUT, (
                "process exceeded its wall-clock timeout" if self.ended == "timed out" else
                "process cancelled") + ": the interpreter was killed, its state is lost",
                audit=audit)
        oom = self.oom_kills  # read by the crash's report, before its cgroup went back
        if done is None and oom:
            raise PolicyEngineError(
                ErrorCode.BUDGET_EXCEEDED, "memory limit exceeded: the out-of-memory killer "
                f"ended the interpreter at the {lim.memory_bytes}-byte limit (`memory`); its "
                "state is lost", audit={**audit, "oom_kills": oom})
        ctx.consume("cpu_ms", cpu_ms)
        if not self.layered or not str(self._status().get("seccomp", "")).startswith("enforced"):
            sanitize.sanitize(self.plan.writable)  # no seccomp refused setuid bits or devices
        ended = _json(done) if done is not None else {}
        code_ = (0 if ended.get("ok") else _status(ended)) if done is not None \
            else self.exit_code
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.PROCESS, meta={
            "op": "proc.exec", "tool": op.tool, "argc": len(op.args) + 1,
            "argv_digest": Digest.of("\0".join((op.tool, *op.args)).encode()).model_dump(),
            "exit_code": code_, "backend": self.executor.name, "interpreter_pid": self.pid}))
        assert self.plan.limits is not None
        return ExecResult(ok=True, out={
            "exit_code": code_, "duration_ms": duration_ms, "cpu_ms": cpu_ms,
            "stdout": out.kept(mark=False).decode(errors="replace"),
            "stderr": err.kept(mark=False).decode(errors="replace"),
            "stdout_truncated": out.truncated, "stderr_truncated": err.truncated,
            "stdout_bytes": out.total, "stderr_bytes": err.total,
            "stdout_digest": out.digest().model_dump(), "stderr_digest": err.digest().model_dump(),
            "backend": self.executor.name, "network": self.plan.network,
            "network_requested": ctx.profile.network.value,
            "isolation": self.executor._isolation(self._status(), self.plan.network),
            "limits": {**describe(self.plan.limits, self.cg),
                       "wall": f"{lim.timeout_s}s a call, the interpreter killed"},
            # a crashed interpreter's cgroup is back in the pool: no peak to read then
            "memory_peak_bytes": self.cg.memory_peak() if self.cg and self.alive else None,
            **({"error_name": ended.get("error")} if ended.get("error") else {}),
        }, used=Usage(cpu_ms=cpu_ms))

    def close(self, reason: str) -> bool:
        """Kill the process group and the cgroup, reap, release; ``True`` if it was alive."""
        with self._lock:
            was = self.proc.returncode is None
            if self.ended is None:
                self.ended = reason
            if was:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                if self.cg is not None:
                    self.cg.kill_all()
                with contextlib.suppress(ChildProcessError):
                    _, status = os.waitpid(self.pid, 0)
                    self.exit_code = _exit_code(status)
                self.proc.returncode = -1  # reaped here; Popen must not wait again
                self.channel.close()
                for fh in (self.proc.stdout, self.proc.stderr):
                    if fh is not None:
                        with contextlib.suppress(OSError):
                            fh.close()
                with contextlib.suppress(OSError):
                    os.close(self.status_r)
                if self.cg is not None and self.pool is not None:
                    self.pool.release(self.cg)
            if self.executor.root_trees is not None:  # its id-mapped binds (idempotent)
                self.executor.root_trees.close()
            return was

    # --- internals ---------------------------------------------------------------------------

    def _exchange(self, send: bytes, ctx: ExecContext, deadline: float, out: HeadTail,
                  err: HeadTail, *, until: bytes) -> bytes | None:
        """Write ``send``, capture the output until the frame tagged ``until`` (its payload)
        or the end (``None``: ``self.ended`` says why; the process is gone by then)."""
        if self.ended is not None:
            return None
        sel = selectors.DefaultSelector()
        pidfd = os.pidfd_open(self.pid)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        sel.register(self.r, selectors.EVENT_READ, "stdout")
        sel.register(self.e, selectors.EVENT_READ, "stderr")
        sel.register(self.status_r, selectors.EVENT_READ, "status")
        view = memoryview(send)
        sel.register(self.c, selectors.EVENT_READ | (selectors.EVENT_WRITE if view else 0),
                     "channel")
        try:
            while True:
                if ctx.cancel.cancelled or time.monotonic() >= deadline:
                    # the orchestrator's watcher cancels with reason "timeout" at the deadline
                    late = time.monotonic() >= deadline or ctx.cancel.reason == "timeout"
                    self._drain(ctx, out, err)
                    self.close("timed out" if late else "cancelled")
                    return None
                for key, events in sel.select(max(0.0, min(deadline - time.monotonic(), 0.2))):
                    if key.data == "exit":
                        self._drain(ctx, out, err)
                        self.close(self._crash_reason())
                        return None
                    if key.data == "channel" and events & selectors.EVENT_WRITE:
                        with contextlib.suppress(BlockingIOError, BrokenPipeError):
                            view = view[os.write(self.c, view[:65536]):]
                        if not view:
                            sel.modify(self.c, selectors.EVENT_READ, "channel")
                    if not events & selectors.EVENT_READ:
                        continue
                    data = _read(key.fd)
                    if data == b"":
                        sel.unregister(key.fd)  # EOF: the exit comes through the pidfd
                    elif data is None:
                        continue
                    elif key.data == "status":
                        if len(self.status) < 8192:
                            self.status += data
                    elif key.data in ("stdout", "stderr"):
                        _capture(ctx, key.data, data, out if key.data == "stdout" else err)
                    else:
                        self.buf += data
                        got = self._frame(until)
                        if got is not None:
                            # what the code wrote before its end frame is in the pipes now
                            self._drain(ctx, out, err)
                            return got
        finally:
            sel.close()
            os.close(pidfd)

    def _frame(self, until: bytes) -> bytes | None:
        """The payload of the first complete frame tagged ``until`` (others are dropped)."""
        while len(self.buf) >= _HEAD.size:
            tag, size = _HEAD.unpack_from(self.buf)
            if size > MAX_FRAME or tag not in (b"R", b"D"):
                self.close("crashed (it broke the frame protocol)")
                raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "the interpreter sent a "
                                        "malformed frame and was killed; its state is lost")
            if len(self.buf) < _HEAD.size + size:
                return None
            payload = bytes(self.buf[_HEAD.size:_HEAD.size + size])
            del self.buf[:_HEAD.size + size]
            if tag == until:
                return payload
        return None

    def _drain(self, ctx: ExecContext, out: HeadTail, err: HeadTail) -> None:
        """What the pipes hold now (bounded: a busy writer cannot keep the call open)."""
        for fd, stream, cap in ((self.r, "stdout", out), (self.e, "stderr", err)):
            for _ in range(256):
                data = _read(fd)
                if not data:
                    break
                _capture(ctx, stream, data, cap)
        with contextlib.suppress(OSError):
            if len(self.status) < 8192:
                self.status += os.read(self.status_r, 8192)

    def _crash_reason(self) -> str:
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(self.pid, 0)
            self.exit_code = _exit_code(status)
            self.proc.returncode = -1
        end = status_pipe.end_signal(self._status().get("tool_end"), 0, False)
        if end:
            self.exit_code = 128 + end
        oom = self.oom_kills = self.cg.oom_kills() if self.cg is not None else 0
        return "crashed (" + ("killed by the out-of-memory killer" if oom else
                              f"signal {end}" if end else f"exit code {self.exit_code}") + ")"

    def _status(self) -> dict[str, Any]:
        return status_pipe.parse(bytes(self.status), 1)

    def _cpu_ms(self) -> int | None:
        return self.cg.cpu_ms() if self.cg is not None else None


def start(executor: ProcExecutor, ctx: ExecContext, op: ProcExecOp,
          lifetime_s: float) -> InterpreterProcess:
    """Spawn the interpreter under the plan ``op`` (the decided call) gets, as its tool.

    :param lifetime_s: the interpreter's CPU-time backstop (RLIMIT_CPU = lifetime × cores);
        each call has its own wall deadline besides.
    :raises PolicyEngineError: not proc-bwrap, a restricted network (its proxy is per call),
        or the sandbox could not start.
    """
    if executor.backend != "bwrap":
        raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"{executor.name} keeps no live "
                             "interpreter (stateful sessions run on proc-bwrap)")
    if ctx.profile.network == NetworkMode.RESTRICTED:
        raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, "a stateful call cannot run "
                             "with the restricted network: its proxy lives for one call")
    server = server_op(op)
    runner = executor._as_tree_owner(bound_paths(ctx.profile)[1])
    plan = runner._plan(ctx, server, "/tmp")
    masks = mask_key(plan)  # as planned: the id-mapped bind below re-points `resolved`
    runner._refuse_engine_trees(plan)
    # a root-owned workspace: an id-mapped bind for the interpreter's life, never a chown;
    # detached when the interpreter is closed
    runner = runner._with_idmapped(plan)
    mapped = runner.root_trees
    if mapped is not None and mapped.failed is not None and runner.run_as is not None:
        mapped.close()
        if runner.mode == "strict":
            raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"{runner.name}: "
                                 f"{mapped.unwritable(runner.run_as)}{owner.STRICT_ADVICE}")
    lim: Limits = resolve_limits(ctx.profile, server, ctx.limits)
    plan.limits = dataclasses.replace(lim, timeout_s=lifetime_s)
    exe, _ = runner._launcher()
    reach = runner._reach(plan, None, exe)
    ctx.started()
    layered = runner.options.layer2
    spec = runner._launcher_spec(plan, None, None) if layered else None
    mine, theirs = socket.socketpair()
    try:
        proc, cg, status_r = runner._spawn(plan, spec, None, exe, plan.limits, [], None, reach,
                                           stdin_fd=theirs.fileno())
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    live = InterpreterProcess(proc, cg, runner._pool, status_r, mine, plan, runner, layered)
    live.masks = masks
    try:
        live.wait_ready(ctx)
    except BaseException:
        live.close("did not start")
        raise
    return live


def _read(fd: int) -> bytes | None:
    """Up to 64 KiB; ``b""`` at EOF, ``None`` when nothing is there yet."""
    try:
        return os.read(fd, 65536)
    except OSError as exc:
        return None if exc.errno == errno.EAGAIN else b""


def _capture(ctx: ExecContext, stream: str, data: bytes, cap: HeadTail) -> None:
    cap.feed(data)
    if ctx.on_output is not None:
        ctx.on_output(stream, data)


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _status(ended: dict[str, Any]) -> int:
    """A failed cell's exit status: a ``SystemExit``'s own code (0–255, as a process exit
    gives it), else 1."""
    status = ended.get("status")
    return status & 0xFF if isinstance(status, int) and not isinstance(status, bool) else 1
