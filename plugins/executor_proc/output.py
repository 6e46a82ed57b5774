"""Concurrent capture of stdout/stderr, bounded to head + tail, and the wait for the child.

One thread multiplexes both pipes, the optional stdin feed, a pidfd for exit and the deadline:
the child is never blocked on a full pipe (we keep draining past the limit) and memory stays
bounded by head + tail whatever it prints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass

from policy_engine.capture import HeadTail
from policy_engine.executor import CancelToken

_CHUNK = 64 * 1024


@dataclass(slots=True)
class Outcome:
    """How the wait ended."""

    status: int | None  # raw wait status; None if the child was never reaped
    rusage_cpu_ms: int = 0
    # bytes the reaped tree wrote to storage (ru_oublock, in 512-byte blocks: write_bytes)
    rusage_written: int = 0
    timed_out: bool = False
    cancelled: bool = False
    status_json: bytes = b""


def pump(pid: int, stdout: int, stderr: int, status_fd: int | None, stdin: int | None,
         stdin_data: bytes, out: HeadTail, err: HeadTail, deadline: float, cancel: CancelToken,
         on_exit: Callable[[], None], kill: Callable[[], None], *,
         on_output: Callable[[str, bytes], None] | None = None) -> Outcome:
    """Drain until exit and EOF; on deadline or cancel call ``kill``; returns the outcome.

    :param on_output: sees each chunk as read (``stdout``/``stderr``), before capping.
    :param on_exit: called once the main child has exited, before it is reaped (its zombie keeps
        the process group id reserved), to kill what it left behind.
    :param status_fd: the launchers' status pipe: read once the main child has exited (or the
        wait ends), not while it runs. A launcher writes its status as the tool starts; waking
        for it then put this thread on a CPU just as the tool was being forked. What the
        launchers write (a few hundred bytes each, 8 KiB at most) never fills the pipe.
    """
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    for fd, tag in ((stdout, "out"), (stderr, "err")):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, tag)
    if status_fd is not None:
        os.set_blocking(status_fd, False)
    if stdin is not None:
        os.set_blocking(stdin, False)
        sel.register(stdin, selectors.EVENT_WRITE, "in")
    result = Outcome(status=None)
    status_buf, exited, view = bytearray(), False, memoryview(stdin_data)
    try:
        while True:
            if cancel.cancelled or time.monotonic() >= deadline:
                result.cancelled, result.timed_out = cancel.cancelled, not cancel.cancelled
                kill()
                break
            timeout = max(0.0, min(deadline - time.monotonic(), 0.2))
            for key, _ in sel.select(timeout):
                tag = key.data
                if tag == "exit":
                    sel.unregister(pidfd)
                    exited = True
                    on_exit()
                    if status_fd is not None:
                        sel.register(status_fd, selectors.EVENT_READ, "status")
                elif tag == "in" and stdin is not None:
                    try:
                        n = os.write(stdin, view[:_CHUNK]) if view else 0
                    except BrokenPipeError:
                        n, view = 0, memoryview(b"")
                    view = view[n:]
                    if not view:
                        sel.unregister(stdin)
                        os.close(stdin)
                        stdin = None
                else:
                    try:
                        data = os.read(key.fd, _CHUNK)
                    except OSError as e:
                        if e.errno == errno.EAGAIN:
                            continue
                        data = b""
                    if not data:
                        sel.unregister(key.fd)
                    elif tag in ("out", "err"):
                        (out if tag == "out" else err).feed(data)
                        if on_output is not None:
                            on_output("stdout" if tag == "out" else "stderr", data)
                    elif len(status_buf) < 4096:
                        status_buf += data
            if exited and not any(k.data in ("out", "err", "status") for k in
                                  sel.get_map().values()):
                break
    finally:
        sel.close()
        os.close(pidfd)
        if stdin is not None:
            with contextlib.suppress(OSError):
                os.close(stdin)
    if not exited:
        on_exit()
        if status_fd is not None:  # what the launchers wrote before the wait was cut short
            with contextlib.suppress(OSError):
                status_buf += os.read(status_fd, 4096)
    _, status, ru = os.wait4(pid, 0)
    result.status = status
    result.rusage_cpu_ms = int((ru.ru_utime + ru.ru_stime) * 1000)
    result.rusage_written = ru.ru_oublock * 512
    result.status_json = bytes(status_buf)
    return result
