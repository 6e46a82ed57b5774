"""The `macos-sandbox-exec` executor: proc.exec under ``/usr/bin/sandbox-exec -p <profile>``.

The profile is ``policy_engine.sandbox.sbpl.render_sbpl`` of the call's profile, with a private
scratch directory as ``TMPDIR``. The environment is never inherited (fixed base keys plus the
op's allow-listed values), the wall clock is the call's deadline, CPU seconds and file sizes are
rlimits, output is kept to head + tail.

On any host but macOS, ``available()`` names the platform, so every call is refused with
``PROVIDER.UNAVAILABLE`` and that reason. The run path was written against Apple's sandbox-exec
and is not executed on this project's Linux CI (docs/macos.md: what is verified, what is not).
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from plugins.executor_macos.capture import Finished, rlimits, run
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.capture import HeadTail
from policy_engine.executor import ExecContext, ExecutorCapabilities, check_string_lists
from policy_engine.guard.binds import cwd_refusal
from policy_engine.guard.env import profile_env_refusal
from policy_engine.guard.gitfiles import GIT_PINS
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    Digest,
    ExecOp,
    ExecResult,
    Limits,
    NetworkMode,
    OpKind,
    ProcExecOp,
    Profile,
    SideEffect,
    SideEffectRec,
    Usage,
)
from policy_engine.sandbox.sbpl import SbplPathError, render_sbpl

NAME = "macos-sandbox-exec"
SANDBOX_EXEC = "/usr/bin/sandbox-exec"
"""By absolute path, never from PATH: a planted ``sandbox-exec`` would run the tool unconfined."""


@dataclass(frozen=True, slots=True)
class MacosOptions:
    """Validated ``macos`` plugin options.

    :param env_allow: extra environment keys a call may set (values come from the op).
    :param env_base: fixed values for ``PATH``, ``LANG`` and ``TZ``.
    :param extra_read: absolute globs readable in the sandbox (a toolchain: ``/opt/homebrew/**``).
    :param max_file_bytes: no file the tool writes grows past this (RLIMIT_FSIZE).
    """

    env_allow: tuple[str, ...] = ()
    env_base: dict[str, str] = field(default_factory=dict)
    extra_read: tuple[str, ...] = ()
    max_file_bytes: int = 1 << 30

    @staticmethod
    def parse(raw: Any) -> MacosOptions:
        opts = dict(raw or {})
        unknown = set(opts) - {"env_allow", "env_base", "extra_read", "max_file_bytes"}
        if unknown:
            raise ValueError(f"macos: unknown options {sorted(unknown)}")
        check_string_lists(opts, ("env_allow", "extra_read"), "macos")
        if any(not p.startswith("/") for p in opts["extra_read"]):
            raise ValueError("macos: `extra_read` must be absolute path globs")
        fsize = opts.get("max_file_bytes", 1 << 30)
        if not isinstance(fsize, int) or isinstance(fsize, bool) or fsize < 1:
            raise ValueError("macos: `max_file_bytes` must be a positive integer")
        return MacosOptions(**opts)


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything one call would start with: argv (sandbox-exec first), env, cwd, the profile."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    profile_text: str
    timeout_s: float
    max_stdout: int
    max_stderr: int


def platform_reason(platform: str = sys.platform) -> str | None:
    """Why sandbox-exec cannot run on ``platform`` (``None`` on macOS)."""
    if platform == "darwin":
        return None
    return f"sandbox-exec is macOS-only; this host is {platform}"


class MacosSandboxExecutor:
    """Runs a ProcExecOp (argv, never a shell) under a generated sandbox-exec profile.

    ``enforces_deadline``: the wait kills the process group at ``ctx.deadline`` or on cancel.
    Network ``restricted`` is not declared: the profile would allow only a policy proxy's
    loopback port and no proxy runs here, so the orchestrator's rule "stricter is no loss"
    serves it as ``off``.
    """

    name = NAME
    enforces_deadline = True
    charges_at_start = True

    def __init__(self, options: MacosOptions | None = None, *, platform: str = sys.platform,
                 sandbox_exec: str = SANDBOX_EXEC) -> None:
        self.options = options or MacosOptions()
        self.sandbox_exec = sandbox_exec
        self._reason = platform_reason(platform)
        if self._reason is None and not os.access(sandbox_exec, os.X_OK):
            self._reason = f"{sandbox_exec} is missing or not executable on this macOS host"
        self.capabilities = ExecutorCapabilities(
            op_kinds=frozenset({OpKind.PROC_EXEC}),
            network_modes=frozenset({NetworkMode.OFF, NetworkMode.ON}),
            # the kernel checks every path against the profile: outside the system trees and
            # the profile's globs nothing is readable, outside its write globs nothing writable
            bind_mounts=True, readonly_rootfs=True,
            # CPU seconds and file size only: macOS enforces neither RLIMIT_AS nor a per-process
            # pids limit (RLIMIT_NPROC counts the user's processes) and has no cgroups
            resource_limits=False,
            env_filtering=True, streaming_output=False,
            # deny rules after every allow (the policy's mandatory globs, the macOS secrets),
            # no unix socket connectable, launchd services by name only (sbpl_base)
            mandatory_denies=True,
        )

    def available(self) -> bool | str:
        """``True`` on macOS with sandbox-exec, else the reason, naming the platform."""
        return True if self._reason is None else self._reason

    def close(self) -> None:
        """Nothing is pooled."""

    def launch(self, profile: Profile, op: ProcExecOp, *, tmpdir: str,
               limits: Limits | None = None) -> Launch:
        """What :meth:`execute` would start (testable on any host); refuses a bad op or a
        profile that cannot be written as SBPL."""
        if any("\x00" in a for a in (op.tool, *op.args)):
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, "argv contains a NUL byte")
        try:
            text = render_sbpl(profile, tmpdir=tmpdir, extra_read=self.options.extra_read)
        except SbplPathError as exc:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, str(exc)) from None
        root = profile.mappings.root_fs.rstrip("/") or "/"
        cwd = op.cwd or (root if os.path.isdir(root) else tmpdir)
        if op.cwd is not None:
            why = cwd_refusal(profile, op.cwd)
            if why is not None:
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, why)
        lim = limits or profile.limits

        def pick(name: str) -> int:
            v = getattr(lim, name)
            return int(v if v is not None else getattr(SYSTEM_DEFAULT_LIMITS, name))

        # the effective limits already hold profile.timeout_ms (or a rule's value replacing it)
        own = (lim.timeout_ms,) if limits is not None else (profile.timeout_ms, lim.timeout_ms)
        timeouts = [t for t in (op.timeout_ms, *own) if t]
        return Launch(
            argv=[self.sandbox_exec, "-p", text, "--", op.tool, *op.args],
            env=self._env(profile, op, tmpdir), cwd=cwd, profile_text=text,
            timeout_s=min(timeouts or [pick("timeout_ms")]) / 1000,
            max_stdout=pick("max_stdout_bytes"), max_stderr=pick("max_stderr_bytes"))

    def _env(self, profile: Profile, op: ProcExecOp, tmpdir: str) -> dict[str, str]:
        """Never inherited: base keys, then op values for allow-listed keys only."""
        env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "en_US.UTF-8", "TZ": "UTC",
               **self.options.env_base, "HOME": profile.mappings.home, "TMPDIR": tmpdir,
               **GIT_PINS}
        for key, value in op.env.items():
            if "\x00" in key or "\x00" in value or "=" in key or not key:
                raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                        f"environment variable `{key}` is malformed")
            if key not in self.options.env_allow:  # second line: the guard decided first
                why = profile_env_refusal(profile, op.tool, {key: value})
                if why is not None:
                    raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, why)
            env[key] = value
        return env

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if not isinstance(op, ProcExecOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, f"{NAME} cannot run `{op.kind}`")
        if self._reason is not None:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, f"{NAME}: {self._reason}")
        stdin = _decode_stdin(op)
        tmpdir = os.path.realpath(tempfile.mkdtemp(prefix="pe-macos-"))  # /var → /private/var
        try:
            plan = self.launch(ctx.profile, op, tmpdir=tmpdir, limits=ctx.limits)
            max_in = ctx.limits.max_bytes_in
            if max_in is None:
                max_in = SYSTEM_DEFAULT_LIMITS.max_bytes_in
            if stdin is not None and max_in is not None and len(stdin) > max_in:
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                        f"stdin of {len(stdin)} bytes exceeds max_bytes_in")
            ctx.started()  # every refusal above was free: nothing has been spawned yet
            start = time.monotonic()
            out, err = HeadTail(plan.max_stdout), HeadTail(plan.max_stderr)
            try:
                done = run(plan.argv, env=plan.env, cwd=plan.cwd, stdin=stdin, out=out, err=err,
                           deadline=min(ctx.deadline, start + plan.timeout_s), cancel=ctx.cancel,
                           preexec=rlimits(max(1, int(plan.timeout_s) + 1),
                                           self.options.max_file_bytes))
            except OSError as exc:
                raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                        f"cannot start sandbox-exec: {exc.strerror}") from None
            return self._result(ctx, op, plan, done, out, err, start)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _result(self, ctx: ExecContext, op: ProcExecOp, plan: Launch, done: Finished,
                out: HeadTail, err: HeadTail, start: float) -> ExecResult:
        duration_ms = int((time.monotonic() - start) * 1000)
        audit = {"backend": NAME, "duration_ms": duration_ms, "cpu_ms": done.cpu_ms,
                 "stdout": out.digest().model_dump(), "stderr": err.digest().model_dump()}
        if done.timed_out or done.cancelled:
            raise PolicyEngineError(ErrorCode.TIMEOUT, "process exceeded its wall-clock timeout"
                                    if done.timed_out else "process cancelled", audit=audit)
        ctx.consume("cpu_ms", done.cpu_ms)
        argv = plan.argv[4:]
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.PROCESS, meta={
            "op": "proc.exec", "tool": op.tool, "argc": len(argv),
            "argv_digest": Digest.of("\0".join(argv).encode()).model_dump(),
            "exit_code": done.exit_code, "backend": NAME}))
        return ExecResult(ok=True, out={
            "exit_code": done.exit_code, "duration_ms": duration_ms, "cpu_ms": done.cpu_ms,
            "stdout": out.kept(mark=False).decode(errors="replace"),
            "stderr": err.kept(mark=False).decode(errors="replace"),
            "stdout_truncated": out.truncated, "stderr_truncated": err.truncated,
            "stdout_bytes": out.total, "stderr_bytes": err.total,
            "stdout_digest": out.digest().model_dump(), "stderr_digest": err.digest().model_dump(),
            "backend": NAME, "network": _network(ctx.profile),
            "isolation": {"sandbox_exec": True,
                          "profile_digest": Digest.of(plan.profile_text.encode()).model_dump()},
        }, used=Usage(cpu_ms=done.cpu_ms))


def _network(profile: Profile) -> str:
    return "on" if profile.network == NetworkMode.ON else "off"


def _decode_stdin(op: ProcExecOp) -> bytes | None:
    if op.stdin_b64 is None:
        return None
    try:
        return base64.b64decode(op.stdin_b64, validate=True)
    except (binascii.Error, ValueError):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "`stdin_b64` is not valid base64") from None

