"""The `proc` executors: argv-only processes under bubblewrap, or under Landlock + seccomp alone."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from plugins.executor_proc import bwrap, cgroups, landlock, seccomp
from plugins.executor_proc.bwrap import NetworkHook
from plugins.executor_proc.limits import describe, preexec
from plugins.executor_proc.output import HeadTail, Outcome, pump
from plugins.executor_proc.spec import Plan, build_plan
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.model import (
    Digest,
    ExecOp,
    ExecResult,
    NetworkMode,
    OpKind,
    ProcExecOp,
    SideEffect,
    SideEffectRec,
    Usage,
)

HERE = os.path.dirname(os.path.abspath(__file__))
Backend = Literal["bwrap", "landlock"]


@dataclass(frozen=True, slots=True)
class ProcOptions:
    """Validated ``proc`` plugin options.

    :param env_allow: extra environment keys a call may set (values come from the op).
    :param env_base: fixed values for the base keys (``LANG``, ``TZ``, ``PATH``).
    :param extra_ro_binds: host trees to expose read-only (e.g. a toolchain under /opt).
    :param layer2: inside bwrap, also apply Landlock + seccomp through the launcher.
    :param python: interpreter that runs the launcher (its prefix is bound read-only).
    :param cgroups: make a per-exec cgroup when possible (else rlimits only).
    :param scan_limit: entries walked to find glob mandatory denies inside the binds.
    """

    env_allow: tuple[str, ...] = ()
    env_base: dict[str, str] = field(default_factory=dict)
    extra_ro_binds: tuple[str, ...] = ()
    layer2: bool = True
    python: str = sys.executable
    cgroups: bool = True
    scan_limit: int = 20_000

    @staticmethod
    def parse(raw: Any) -> ProcOptions:
        opts = dict(raw or {})
        known = {"env_allow", "env_base", "extra_ro_binds", "layer2", "python", "cgroups",
                 "scan_limit"}
        if set(opts) - known:
            raise ValueError(f"proc: unknown options {sorted(set(opts) - known)}")
        for key in ("env_allow", "extra_ro_binds"):
            v = opts.get(key, ())
            if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"proc: `{key}` must be a list of strings")
            opts[key] = tuple(v)
        if any(not p.startswith("/") for p in opts["extra_ro_binds"]):
            raise ValueError("proc: `extra_ro_binds` must be absolute paths")
        base = opts.get("env_base", {})
        if not isinstance(base, dict) or set(base) - {"PATH", "LANG", "TZ"}:
            raise ValueError("proc: `env_base` may only set PATH, LANG and TZ")
        for key in ("layer2", "cgroups"):
            if not isinstance(opts.get(key, True), bool):
                raise ValueError(f"proc: `{key}` must be a boolean")
        if not isinstance(opts.get("scan_limit", 1), int) or opts.get("scan_limit", 1) < 1:
            raise ValueError("proc: `scan_limit` must be a positive integer")
        if not os.path.isabs(str(opts.get("python", sys.executable))):
            raise ValueError("proc: `python` must be an absolute path")
        return ProcOptions(**opts)


class ProcExecutor:
    """Runs a ProcExecOp (argv, never a shell). ``backend`` picks bubblewrap (namespaces, binds,
    masks; Landlock + seccomp inside as a second layer) or Landlock + seccomp alone.
    """

    def __init__(self, backend: Backend, options: ProcOptions | None = None, *,
                 network_hook: NetworkHook | None = None) -> None:
        self.backend = backend
        self.name = f"proc-{backend}"
        self.options = options or ProcOptions()
        self.network_hook = network_hook
        self.landlock_abi = landlock.abi_version()
        if backend == "bwrap":
            p = bwrap.probe()
            self.bwrap_path, self.available, self.unavailable_reason = p.path, p.ok, p.reason
        else:
            self.bwrap_path = None
            self.available = self.landlock_abi > 0 and seccomp.supported()
            self.unavailable_reason = "ok" if self.available else (
                "landlock is not enabled in this kernel" if self.landlock_abi <= 0
                else "no seccomp syscall table for this architecture")
        self.capabilities = ExecutorCapabilities(
            op_kinds=frozenset({OpKind.PROC_EXEC}),
            network_modes=frozenset({NetworkMode.OFF, NetworkMode.ON}
                                    | ({NetworkMode.RESTRICTED} if network_hook else set())),
            bind_mounts=backend == "bwrap", readonly_rootfs=True, resource_limits=True,
            env_filtering=True, streaming_output=False,
        )
        if self.options.cgroups:
            cgroups.sweep_stale()

    def close(self) -> None:
        """Nothing pooled: every exec owns and removes its cgroup and temp dir."""

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if not isinstance(op, ProcExecOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, f"proc cannot run `{op.kind}`")
        if not self.available:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"{self.name}: {self.unavailable_reason}")
        stdin = _decode_stdin(op)
        private_tmp = None if self.backend == "bwrap" else tempfile.mkdtemp(prefix="pe-proc-")
        try:
            plan = build_plan(ctx.profile, op, env_allow=self.options.env_allow,
                              env_base=self.options.env_base,
                              extra_ro=self.options.extra_ro_binds,
                              tmpdir=private_tmp or "/tmp", scan_limit=self.options.scan_limit)
            network = plan.network
            if plan.network == "restricted" and self.network_hook is None:
                plan.network = "off"  # stricter than asked, never wider; reported below
            return self._run(ctx, op, plan, stdin, private_tmp, network)
        finally:
            if private_tmp is not None:
                _rmtree(private_tmp)

    def _launcher_spec(self, plan: Plan, private_tmp: str | None) -> dict[str, Any]:
        off = plan.network != "on"
        strict = self.backend == "landlock"
        if self.backend == "bwrap":
            extra = [("/tmp", "rw"), ("/dev", "dev"), ("/proc", "ro")]
        else:
            # no /proc here: the host's would show every process's environment to root
            extra = [(private_tmp or "/nonexistent", "rw"), ("/dev/null", "dev"),
                     ("/dev/zero", "dev"), ("/dev/urandom", "ro"), ("/dev/random", "ro")]
        return {
            "drop_caps": strict and os.geteuid() == 0,
            "landlock": {"rules": plan.landlock_rules(extra, carve_masks=strict),
                         "deny_tcp": off, "scope": True,
                         "required": strict},
            "seccomp": {"deny_inet": off, "deny_setsid": strict, "required": strict},
        }

    def _command(self, plan: Plan, spec: dict[str, Any] | None, status_fd: int) -> list[str]:
        tail = [str(status_fd), "--", *plan.argv]
        if self.backend == "landlock":
            return [self.options.python, "-I", "-S", "-B", os.path.join(HERE, "launcher.py"),
                    json.dumps(spec), *tail]
        assert self.bwrap_path is not None
        inner = ([self.options.python, "-I", "-S", "-B", f"{bwrap.LAUNCHER_DIR}/launcher.py",
                  json.dumps(spec), *tail] if spec is not None else plan.argv)
        return bwrap.build_argv(self.bwrap_path, plan, inner=inner,
                                launcher_src=HERE if spec is not None else None,
                                network_hook=self.network_hook)

    def _run(self, ctx: ExecContext, op: ProcExecOp, plan: Plan, stdin: bytes | None,
             private_tmp: str | None, asked_network: str) -> ExecResult:
        assert plan.limits is not None
        lim = plan.limits
        if stdin is not None and len(stdin) > lim.max_stdin:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    f"stdin of {len(stdin)} bytes exceeds max_bytes_in")
        layered = self.backend == "landlock" or self.options.layer2
        spec = self._launcher_spec(plan, private_tmp) if layered else None
        cg = cgroups.create(lim.pids, lim.memory_bytes, lim.cpu_cores) \
            if self.options.cgroups else None
        status_r, status_w = os.pipe()
        start = time.monotonic()
        deadline = min(ctx.deadline, start + lim.timeout_s)
        try:
            proc = subprocess.Popen(
                self._command(plan, spec, status_w),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=plan.env if self.backend == "landlock" else {},
                cwd=plan.cwd if self.backend == "landlock" else "/", start_new_session=True,
                preexec_fn=preexec(lim, cg), pass_fds=(status_w,), close_fds=True)
        except OSError as exc:
            os.close(status_r)
            if cg:
                cg.remove()
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"cannot start the sandbox: {exc.strerror}") from None
        finally:
            os.close(status_w)
        assert proc.stdout is not None
        assert proc.stderr is not None

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if cg:
                cg.kill_all()

        out, err = HeadTail(lim.max_stdout), HeadTail(lim.max_stderr)
        try:
            outcome = pump(proc.pid, proc.stdout.fileno(), proc.stderr.fileno(), status_r,
                           proc.stdin.fileno() if proc.stdin else None, stdin or b"", out, err,
                           deadline, ctx.cancel, kill, kill)
        finally:
            proc.returncode = -1  # reaped by pump's wait4; keep Popen from waiting again
            for fh in (proc.stdout, proc.stderr):
                fh.close()
            os.close(status_r)
            memory_peak = cg.memory_peak() if cg else None
            cg_cpu = cg.cpu_ms() if cg else None
            if cg:
                cg.remove()
        if cg_cpu is not None:
            outcome.rusage_cpu_ms = max(outcome.rusage_cpu_ms, cg_cpu)
        return self._result(ctx, op, plan, outcome, out, err, start, cg, memory_peak,
                            asked_network)

    def _result(self, ctx: ExecContext, op: ProcExecOp, plan: Plan, oc: Outcome, out: HeadTail,
                err: HeadTail, start: float, cg: cgroups.ExecCgroup | None,
                memory_peak: int | None, asked_network: str) -> ExecResult:
        assert plan.limits is not None
        assert oc.status is not None
        duration_ms = int((time.monotonic() - start) * 1000)
        status = _parse_status(oc.status_json)
        code = os.waitstatus_to_exitcode(oc.status)
        audit = {"backend": self.name, "duration_ms": duration_ms, "cpu_ms": oc.rusage_cpu_ms,
                 "stdout": out.digest().model_dump(), "stderr": err.digest().model_dump()}
        if oc.timed_out or oc.cancelled:
            raise PolicyEngineError(ErrorCode.TIMEOUT, "process exceeded its wall-clock timeout"
                                    if oc.timed_out else "process cancelled", audit=audit)
        if "error" in status:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    f"{self.name}: isolation could not be applied: "
                                    f"{status['error']}", audit=audit)
        if self.backend == "bwrap" and not status and code != 0 and (
                err.value().startswith(b"bwrap:")):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "bwrap could not set up the "
                                    "sandbox: " + err.value().decode(errors="replace")[:300],
                                    audit=audit)
        ctx.consume("cpu_ms", oc.rusage_cpu_ms)
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.PROCESS, meta={
            "op": "proc.exec", "tool": op.tool, "argc": len(plan.argv),
            "argv_digest": Digest.of("\0".join(plan.argv).encode()).model_dump(),
            "exit_code": code, "backend": self.name}))
        return ExecResult(ok=True, out={
            "exit_code": code, "duration_ms": duration_ms, "cpu_ms": oc.rusage_cpu_ms,
            "stdout": out.value().decode(errors="replace"),
            "stderr": err.value().decode(errors="replace"),
            "stdout_truncated": out.truncated, "stderr_truncated": err.truncated,
            "stdout_bytes": out.total, "stderr_bytes": err.total,
            "stdout_digest": out.digest().model_dump(), "stderr_digest": err.digest().model_dump(),
            "backend": self.name, "network": plan.network, "network_requested": asked_network,
            "isolation": {"bwrap": self.backend == "bwrap", **(status or {"landlock": "off",
                                                                          "seccomp": "off"})},
            "limits": describe(plan.limits, cg), "memory_peak_bytes": memory_peak,
            "masked": plan.mask_files + plan.mask_dirs,
        }, used=Usage(cpu_ms=oc.rusage_cpu_ms))


def _decode_stdin(op: ProcExecOp) -> bytes | None:
    if op.stdin_b64 is None:
        return None
    try:
        return base64.b64decode(op.stdin_b64, validate=True)
    except (binascii.Error, ValueError):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "`stdin_b64` is not valid base64") from None


def _parse_status(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {"error": "launcher status unreadable"}
    return value if isinstance(value, dict) else {"error": "launcher status malformed"}


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
