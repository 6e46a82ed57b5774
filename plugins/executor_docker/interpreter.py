"""A docker session's live Python interpreter: a long-lived ``docker exec`` of
``interpreter_server.py`` (framed mode) in the session's own warm container.

The exec runs as the container's user in the container's cgroup (the profile's memory, pids and
CPU quota, updated like a call's), with the call's environment and cwd; before any code it makes
itself a session leader, sets its CPU-time backstop and installs the network-off seccomp filter
a pooled command gets. Protocol and output share the exec's stdout (the server frames the code's
stdout/stderr itself, ``O``/``E``, then ``D``); its stderr carries only what the server writes
before that. The container's launcher is told to spare the interpreter's session between calls
(``Control.keep``): a plain call's end still kills everything else. A call that times out or is
cancelled, or a restart or the session's end, kills that session: the launcher forgets it and
sweeps the container (``/bin/true`` through it; no host privilege needed), after a host-side
SIGKILL through the server's pidfd where the engine may signal it. Each call holds the slot's
command lock, so its CPU charge is the container cgroup's delta, as for a warm call.

The container is made with the masks of the call that made it and cannot get a mount later, so
the interpreter lives only as long as those masks are the session's: before each call it plans
what its plain twin would get (:meth:`DockerInterpreter.stale`) and the session restarts it in a
re-made container when they differ; a plain call that must re-make the container stops the
interpreter first (``Slot.holder``: after its running call, if any), never waiting on its hold
for the rest of its life (attack 35, F1 and F2).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugins.executor_docker import engine, interpreter_masks, runtimes, setid
from plugins.executor_docker.bound import binds_of
from plugins.executor_docker.control import ControlBroken
from plugins.executor_docker.cpu import ROOT, of_process, usage_ns
from plugins.executor_proc.interpreter import MAX_CODE, MAX_FRAME
from plugins.executor_proc.interpreter_masks import SERVER_SOURCE
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.capture import HeadTail
from policy_engine.errors import BackendRefusal
from policy_engine.executor import ExecContext
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    Digest,
    ExecResult,
    NetworkMode,
    ProcExecOp,
    SideEffect,
    SideEffectRec,
    Usage,
)
from policy_engine.sandbox.artifacts import ARTIFACTS_ENV, artifacts_dir

if TYPE_CHECKING:
    import docker

    from plugins.executor_docker.executor import DockerExecutor
    from plugins.executor_docker.pool import Slot, WarmPool

_SERVER = struct.Struct(">cI")  # interpreter_server.py's frames
_MUX = struct.Struct(">BxxxI")  # docker's attach stream: 1 stdout, 2 stderr
_TAGS = (b"R", b"D", b"O", b"E")


class DockerInterpreter:
    """One live interpreter in a session's container; one call at a time (the caller
    serialises). ``ended`` is ``None`` while it lives, else why it ended."""

    def __init__(self, executor: DockerExecutor, pool: WarmPool, slot: Slot,
                 api: docker.APIClient, exec_id: str, sock: socket.socket,
                 hard: engine.Hardening, key: str) -> None:
        self.executor, self.pool, self.slot, self.api = executor, pool, slot, api
        self.exec_id, self.sock, self.hard, self.key = exec_id, sock, hard, key
        self.mux = bytearray()
        self.buf = bytearray()
        self.ended: str | None = None
        self.info: dict[str, Any] = {}
        self.exit_code: int | None = None
        self.cgroup = executor._cgroup_of(slot.container_id)
        self.pidfd: int | None = None  # the server on the host (exec_inspect's pid): a pid
        # alone may be reused once it is reaped; its pidfd names this process only
        self.memory_cgroup: str | None = None
        self.oom_base = 0  # the container's OOM kills when it started
        self._lock = threading.Lock()
        sock.setblocking(False)

    @property
    def pid(self) -> int:
        """The server's pid in the container (its session id there)."""
        return int(self.info.get("pid") or 0)

    @property
    def alive(self) -> bool:
        return self.ended is None

    def call(self, ctx: ExecContext, op: ProcExecOp, code: str) -> ExecResult:
        """Run ``code`` (the decided op's) under ``ctx``'s deadline.

        :raises PolicyEngineError: ``LLM.TIMEOUT`` (deadline or cancel: the interpreter was
            killed), ``QUOTA.BUDGET_EXCEEDED`` (the container's OOM killer ended it).
        """
        data = code.encode("utf-8", "surrogatepass")
        if len(data) > MAX_CODE:
            raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"the code is {len(data)} "
                                 f"bytes; a stateful call takes at most {MAX_CODE}")
        timeout_s = min((t for t in (op.timeout_ms, ctx.limits.timeout_ms) if t),
                        default=ctx.profile.timeout_ms) / 1000
        ctx.started()
        out = HeadTail(_limit(ctx, "max_stdout_bytes"))
        err = HeadTail(_limit(ctx, "max_stderr_bytes"))
        start = time.monotonic()
        deadline = min(ctx.deadline, start + timeout_s)
        if not self.slot.running.acquire(timeout=max(0.0, deadline - start)):
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "the session's warm "
                                    "container ran another command until this call's deadline")
        try:
            if self.ended is not None:  # stopped for a re-made container while this waited
                raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "the interpreter ended "
                                        f"before this call ran ({self.ended}); its state is "
                                        "lost: call again to start a fresh one")
            cpu0, oom0 = self._cpu_ns(), self._ooms()
            self._stale()
            done = self._exchange(_SERVER.pack(b"C", len(data)) + data, ctx, deadline, out,
                                  err, until=b"D", held=True)
            cpu_ms = max(0, (self._cpu_ns() or 0) - (cpu0 or 0)) // 1_000_000
            ooms = self._ooms() - oom0
        finally:
            self.slot.running.release()
        duration_ms = int((time.monotonic() - start) * 1000)
        audit = {"backend": "docker", "duration_ms": duration_ms, "cpu_ms": cpu_ms,
                 "stdout": out.digest().model_dump(), "stderr": err.digest().model_dump(),
                 "interpreter": {"pid": self.pid, "ended": self.ended,
                                 "container": self.slot.container_id[:12]}}
        if done is None and self.ended in ("timed out", "cancelled"):
            raise PolicyEngineError(ErrorCode.TIMEOUT, (
                f"process exceeded its {timeout_s:g}s wall time" if self.ended == "timed out"
                else "process cancelled") + ": the interpreter was killed, its state is lost",
                audit=audit)
        if done is None and ooms:
            raise PolicyEngineError(
                ErrorCode.BUDGET_EXCEEDED, "memory limit exceeded: the out-of-memory killer "
                f"ended the interpreter at the container's {self.hard.mem_limit} limit "
                "(`memory`); its state is lost", audit={**audit, "oom_kills": ooms})
        ctx.consume("cpu_ms", cpu_ms)
        # third line after seccomp: no set-id file or device node stays in the session's files
        stripped = [p for top, ro in binds_of(ctx.profile) if not ro
                    for p in setid.sweep(Path(top))]
        ended = _json(done) if done is not None else {}
        exit_code = (0 if ended.get("ok") else _status(ended)) if done is not None \
            else self.exit_code
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.PROCESS, meta={
            "op": "proc.exec", "tool": op.tool, "argc": len(op.args) + 1,
            "argv_digest": Digest.of("\0".join((op.tool, *op.args)).encode()).model_dump(),
            "exit_code": exit_code, "backend": "docker", "interpreter_pid": self.pid,
            "container": self.slot.container_id[:12]}))
        return ExecResult(ok=True, out={
            "exit_code": exit_code, "duration_ms": duration_ms, "cpu_ms": cpu_ms,
            "cpu_source": "cgroup" if cpu0 is not None else "unavailable",
            "stdout": out.kept(mark=False).decode(errors="replace"),
            "stderr": err.kept(mark=False).decode(errors="replace"),
            "stdout_truncated": out.truncated, "stderr_truncated": err.truncated,
            "stdout_bytes": out.total, "stderr_bytes": err.total,
            "stdout_digest": out.digest().model_dump(), "stderr_digest": err.digest().model_dump(),
            "backend": "docker", "mode": "pool", "network": ctx.profile.network.value,
            "container": self.hard.snapshot(),
            "limits": {"wall": f"{timeout_s:g}s a call, the interpreter killed"},
            **({"setid_stripped": stripped[:100]} if stripped else {}),
            **({"error_name": ended.get("error")} if ended.get("error") else {}),
        }, used=Usage(cpu_ms=cpu_ms))

    def stale(self, ctx: ExecContext, op: ProcExecOp) -> str | None:
        """How the container a plain call of ``op`` would get now differs from this one's
        (its masks, binds or identity, planned as ``_pooled`` plans them), or ``None``.

        :raises PolicyEngineError: the plan is refused now (the plain call would be too).
        """
        return interpreter_masks.difference(self.executor, ctx, self.slot)

    def stop(self, reason: str, timeout_s: float) -> bool:
        """The pool re-makes the session's container (``Slot.holder``): end the interpreter
        once its running call (if any) is over, within ``timeout_s``; ``True`` once it no
        longer holds the container."""
        if self.pool is None:
            return True
        if not self.slot.running.acquire(timeout=timeout_s):
            return False
        try:
            self.close(reason, held=True)
        finally:
            self.slot.running.release()
        return True

    def close(self, reason: str, *, held: bool = False) -> bool:
        """Kill the interpreter's session in the container, forget it, give the container's
        hold back; ``True`` if it was alive. ``held``: the caller holds the slot's lock."""
        with self._lock:
            if self.exit_code is None and self.ended is None:
                self.exit_code = self._exit_code()
            was = self.ended is None and self.exit_code is None
            if self.ended is None:
                self.ended = reason
            if self.pool is None:
                return was
            if self.pidfd is not None:
                # at once where the engine may signal it (root); the sweep below anyway
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                os.close(self.pidfd)
                self.pidfd = None
            if held or self.slot.running.acquire(timeout=30):
                try:
                    self._sweep()
                finally:
                    if not held:
                        self.slot.running.release()
            self.sock.close()
            if self.slot.holder == self.stop:
                self.pool.hold(self.slot, None)
            self.pool.done(self.slot)
            self.pool = None  # type: ignore[assignment]  # closed: nothing held any more
            return was

    # --- internals ---------------------------------------------------------------------------

    def _sweep(self) -> None:
        """The launcher forgets the session and kills every process of the container."""
        control = self.slot.control
        if control is None or not control.alive:
            return
        with contextlib.suppress(ControlBroken):
            control.keep([])
            control.run(["/bin/true"], {}, "/", (4096, 4096), time.monotonic() + 10)

    def _exchange(self, send: bytes, ctx: ExecContext, deadline: float, out: HeadTail,
                  err: HeadTail, *, until: bytes, held: bool) -> bytes | None:
        """Write ``send``, capture output until the frame ``until`` (its payload) or the end
        (``None``: ``self.ended`` says why; the interpreter is gone by then)."""
        if self.ended is not None:
            return None
        view = memoryview(send)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if view else 0))
        try:
            while True:
                if ctx.cancel.cancelled or time.monotonic() >= deadline:
                    late = time.monotonic() >= deadline or ctx.cancel.reason == "timeout"
                    self.close("timed out" if late else "cancelled", held=held)
                    return None
                for _, events in sel.select(max(0.0, min(deadline - time.monotonic(), 0.2))):
                    if events & selectors.EVENT_WRITE:
                        with contextlib.suppress(BlockingIOError):
                            view = view[self.sock.send(view[:65536]):]
                        if not view:
                            sel.modify(self.sock, selectors.EVENT_READ)
                    if not events & selectors.EVENT_READ:
                        continue
                    try:
                        data = self.sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:  # the exec ended: a crash (nothing asked it to)
                        self.exit_code = self._exit_code(wait=True)
                        self.close(self._crash_reason(), held=held)
                        return None
                    got = self._feed(ctx, data, out, err, until, held)
                    if got is not None:
                        return got
        finally:
            sel.close()

    def _stale(self) -> None:
        """Output a background child of an earlier call wrote after that call's end belongs to
        no call: parsed (the frames stay aligned) and dropped, bounded; an end of the stream
        is left for the call to see as a crash."""
        for _ in range(64):
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            self._feed(None, data, HeadTail(0), HeadTail(0), b"", held=True)

    def _feed(self, ctx: ExecContext | None, data: bytes, out: HeadTail, err: HeadTail,
              until: bytes, held: bool) -> bytes | None:
        """Docker's stream frames, then the server's in its stdout."""
        self.mux += data
        while len(self.mux) >= _MUX.size:
            stream, size = _MUX.unpack_from(self.mux)
            if len(self.mux) < _MUX.size + size:
                break
            chunk = bytes(self.mux[_MUX.size:_MUX.size + size])
            del self.mux[:_MUX.size + size]
            if stream == 1:
                self.buf += chunk
            elif ctx is not None:  # the server's own stderr, before its pipes were in place
                _capture(ctx, "stderr", chunk, err)
        while len(self.buf) >= _SERVER.size:
            tag, size = _SERVER.unpack_from(self.buf)
            if size > MAX_FRAME or tag not in _TAGS:
                self.close("crashed (it broke the frame protocol)", held=held)
                raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "the interpreter sent a "
                                        "malformed frame and was killed; its state is lost")
            if len(self.buf) < _SERVER.size + size:
                break
            payload = bytes(self.buf[_SERVER.size:_SERVER.size + size])
            del self.buf[:_SERVER.size + size]
            if ctx is None:
                continue
            if tag == b"O":
                _capture(ctx, "stdout", payload, out)
            elif tag == b"E":
                _capture(ctx, "stderr", payload, err)
            elif tag == until:
                return payload
        return None

    def _exit_code(self, wait: bool = False) -> int | None:
        for _ in range(100 if wait else 1):
            with contextlib.suppress(Exception):
                info = self.api.exec_inspect(self.exec_id)
                if not info.get("Running"):
                    code = info.get("ExitCode")
                    return int(code) if code is not None else -1
            if wait:
                time.sleep(0.01)
        return None

    def _crash_reason(self) -> str:
        code = self.exit_code
        if self._ooms() > self.oom_base:
            return "crashed (killed by the out-of-memory killer)"
        if code is not None and code > 128:
            return f"crashed (signal {code - 128})"
        return f"crashed (exit code {code})"

    def _cpu_ns(self) -> int | None:
        return usage_ns(self.cgroup) if self.cgroup else None

    def _ooms(self) -> int:
        """The container memory cgroup's OOM kills so far (v2 ``memory.events``, v1
        ``memory.oom_control``)."""
        rel = self.memory_cgroup
        if rel is None:
            return 0
        for path in (ROOT / rel.strip("/") / "memory.events",
                     ROOT / "memory" / rel.strip("/") / "memory.oom_control"):
            with contextlib.suppress(OSError, ValueError):
                for line in path.read_text().split("\n"):
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0


def start(executor: DockerExecutor, ctx: ExecContext, op: ProcExecOp,
          lifetime_s: float) -> DockerInterpreter:
    """Start the interpreter in the session's container, under the plan ``op`` would get.

    :param lifetime_s: its CPU-time backstop (RLIMIT_CPU, seconds); each call has its own
        wall deadline besides.
    :raises PolicyEngineError: not a bound call in pool mode with the launcher, a restricted
        network (its proxy is per call), or the interpreter did not start.
    """
    from plugins.executor_docker.executor import _UNIX_FILTER, _env, bound_key

    profile = ctx.profile
    if profile.network == NetworkMode.RESTRICTED:
        raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, "a stateful call cannot run "
                             "with the restricted network: its proxy lives for one call")
    cwd, bound = executor._placement(profile, op)
    if executor.options.mode != "pool" or bound is None:
        raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, "docker keeps a live interpreter "
                             "only for a session's calls in pool mode (its own container)")
    runtime = runtimes.for_profile(profile, executor.runtimes)
    hard = engine.hardening(profile, executor.options, ctx.limits, runtime=runtime,
                            gvisor=runtime is not None and runtime == executor.runtimes.gvisor)
    env = {**_env(op.env, profile, op.tool), ARTIFACTS_ENV: artifacts_dir(cwd), "HOME": cwd}
    ctx.started()
    pool = executor.pool(hard.runtime)  # connects: the daemon's CPU count is known after it
    hard = hard.on_host_of(executor.daemon_cpus)
    key = bound_key(profile.tenant, profile.subject_id, bound)
    slot = _acquire(executor, pool, key, ctx)
    try:
        slot = pool.update_limits(slot, hard)
        if slot.control is None:
            raise BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, "docker keeps a live "
                                 "interpreter only in containers run by the launcher")
        if not slot.running.acquire(timeout=max(0.0, ctx.deadline - time.monotonic())):
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "the session's warm "
                                    "container ran another command until the deadline")
    except BaseException:
        pool.done(slot)
        raise
    _, api = executor.client()
    off = profile.network is NetworkMode.OFF
    argv = [op.tool, "-c", SERVER_SOURCE, "framed", _UNIX_FILTER if off else "-",
            str(max(1, int(lifetime_s)))]
    live: DockerInterpreter | None = None
    try:
        try:
            made = api.exec_create(slot.container_id, argv, stdin=True, stdout=True,
                                   stderr=True, tty=False, environment=env, workdir=cwd)
            raw = api.exec_start(made["Id"], socket=True)
        except Exception as exc:  # noqa: BLE001 -- the daemon's errors leave with a code
            raise engine.map_error(exc) from None
        sock = getattr(raw, "_sock", raw)
        live = DockerInterpreter(executor, pool, slot, api, made["Id"], sock, hard, key)
        err = HeadTail(4096)
        got = live._exchange(b"", ctx, ctx.deadline, HeadTail(4096), err, until=b"R",
                             held=True)
        if got is None:
            why = err.kept(mark=False).decode(errors="replace")[:300]
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "the interpreter could not "
                                    f"start in the container ({live.ended}): {why}")
        live.info = {**_json(got), "container": slot.container_id[:12]}
        with contextlib.suppress(Exception):  # host facts: kept off the session's events
            host_pid = int(api.exec_inspect(made["Id"])["Pid"])
            live.pidfd = os.pidfd_open(host_pid)  # alive: it answered R and waits for code
            live.memory_cgroup = of_process(host_pid, "memory")
        live.oom_base = live._ooms()
        try:
            slot.control.keep([int(live.info.get("sid") or live.pid)])  # spared from now on
        except ControlBroken as exc:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "the session's container "
                                    f"launcher is gone: {exc}") from None
        pool.hold(slot, live.stop)  # a re-make for other masks ends it first (acquire_bound)
    except BaseException:
        if live is not None:
            live.close("did not start", held=True)
        else:
            pool.done(slot)
        raise
    finally:
        slot.running.release()
    return live


def _acquire(executor: DockerExecutor, pool: WarmPool, key: str, ctx: ExecContext) -> Slot:
    """The session's bound container, exactly as its plain calls get it
    (``interpreter_masks.wanted``); the exec then runs as the container's own user."""
    left = engine.START_ATTEMPTS - 1  # planned again when a masked path vanished meanwhile
    while True:
        ident, mounts, masked = interpreter_masks.wanted(executor, ctx)
        try:
            return executor._acquire_bound(pool, key, ident, mounts, masked,
                                           max(0.0, ctx.deadline - time.monotonic()))
        except PolicyEngineError as err:
            if not left or not engine.mount_raced(err) or time.monotonic() >= ctx.deadline:
                raise
            left -= 1


def _limit(ctx: ExecContext, name: str) -> int:
    value = getattr(ctx.limits, name)
    return int(value if value is not None else getattr(SYSTEM_DEFAULT_LIMITS, name))


def _capture(ctx: ExecContext, stream: str, data: bytes, cap: HeadTail) -> None:
    cap.feed(data)
    if ctx.on_output is not None:
        ctx.on_output(stream, data)


def _json(raw: bytes | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _status(ended: dict[str, Any]) -> int:
    """A failed cell's exit status: a ``SystemExit``'s own code (0–255, as a process exit
    gives it), else 1."""
    status = ended.get("status")
    return status & 0xFF if isinstance(status, int) and not isinstance(status, bool) else 1
