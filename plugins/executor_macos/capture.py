"""Portable spawn-and-wait for the macOS executor: bounded stdout/stderr, stdin, deadline, cancel.

The proc executor's ``output.pump`` waits on a pidfd (Linux only); this one uses a reader thread
per pipe and ``Popen.wait`` with a short timeout, which works on every POSIX system. The child
leads its own process group, so a timeout or cancel kills everything it started.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from policy_engine.capture import HeadTail
from policy_engine.executor import CancelToken

_CHUNK = 64 * 1024


@dataclass(slots=True)
class Finished:
    """How the child ended: its exit code (128 + N for signal N), CPU time, why it stopped."""

    exit_code: int
    cpu_ms: int
    timed_out: bool = False
    cancelled: bool = False


def rlimits(cpu_seconds: int, max_file_bytes: int) -> Callable[[], None]:
    """What the child sets before exec: CPU seconds, file size, no core dumps. (macOS enforces
    these; it ignores RLIMIT_AS and counts RLIMIT_NPROC per user, so memory and pids are not
    limited: the executor declares ``resource_limits=False``.)"""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return apply


def _drain(pipe: IO[bytes], sink: HeadTail) -> None:
    with contextlib.suppress(OSError, ValueError):
        while chunk := pipe.read1(_CHUNK):  # type: ignore[attr-defined]
            sink.feed(chunk)


def _feed(pipe: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        pipe.write(data)
    with contextlib.suppress(OSError, ValueError):
        pipe.close()


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin: bytes | None,
        out: HeadTail, err: HeadTail, deadline: float, cancel: CancelToken,
        preexec: Callable[[], None] | None = None) -> Finished:
    """Spawn ``argv`` (never through a shell) and wait for it, draining both pipes."""
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env), cwd=cwd,
        start_new_session=True, close_fds=True, preexec_fn=preexec)
    assert proc.stdout is not None
    assert proc.stderr is not None
    threads = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)]
    if stdin is not None and proc.stdin is not None:
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
    for t in threads:
        t.start()
    timed_out = cancelled = False
    pause = 0.01
    while True:  # wait4, not Popen.wait: the child's own rusage, not every child's
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if cancel.cancelled or time.monotonic() >= deadline:
            cancelled, timed_out = cancel.cancelled, not cancel.cancelled
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            break
        cancel.wait(max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, 0.2)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    # what the child left behind in its group goes with it; a pipe still held open elsewhere
    # must not hold the call: the readers get one second
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=1.0)
    for fh in (proc.stdout, proc.stderr):
        fh.close()
    return Finished(exit_code=128 - code if code < 0 else code,
                    cpu_ms=int((usage.ru_utime + usage.ru_stime) * 1000),
                    timed_out=timed_out, cancelled=cancelled)
