"""Concurrent capture of stdout/stderr, bounded to head + tail, and the wait for the child.

One thread multiplexes both pipes, the optional stdin feed, a pidfd for exit and the deadline:
the child is never blocked on a full pipe (we keep draining past the limit) and memory stays
bounded by head + tail whatever it prints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass

from policy_engine.capture import HeadTail
from policy_engine.executor import CancelToken

_CHUNK = 64 * 1024


def _read_ready(fd: int, buf: bytearray) -> bool:
    """Append what the launchers' status pipe ``fd`` (non-blocking) holds now to ``buf``, 4 KiB
    at most kept; ``True`` at its end (or an error), ``False`` when more may come."""
    while True:
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if not data:
            return True
        if len(buf) < 4096:
            buf += data


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
    # one poll(2) per wait, no epoll instance made, filled and closed per call (five syscalls
    # and the selector's bookkeeping on every proc call's path)
    poller = select.poll()
    pidfd = os.pidfd_open(pid)
    tags = {pidfd: "exit"}
    poller.register(pidfd, select.POLLIN)
    for fd, tag in ((stdout, "out"), (stderr, "err")):
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
        tags[fd] = tag
    if status_fd is not None:
        os.set_blocking(status_fd, False)
    if stdin is not None:
        os.set_blocking(stdin, False)
        poller.register(stdin, select.POLLOUT)
        tags[stdin] = "in"
    result = Outcome(status=None)
    status_buf, exited, view = bytearray(), False, memoryview(stdin_data)

    def drop(fd: int) -> None:
        poller.unregister(fd)
        del tags[fd]

    try:
        while True:
            if cancel.cancelled or time.monotonic() >= deadline:
                result.cancelled, result.timed_out = cancel.cancelled, not cancel.cancelled
                kill()
                break
            timeout = max(0.0, min(deadline - time.monotonic(), 0.2))
            for fd, _ in poller.poll(timeout * 1000):
                what = tags.get(fd)
                if what is None:  # dropped by an earlier event of this round
                    continue
                if what == "exit":
                    drop(pidfd)
                    exited = True
                    on_exit()
                    # what the launchers wrote, read now: usually all of it and its end, with
                    # no poll round more; else the poll waits for the rest
                    if status_fd is not None and not _read_ready(status_fd, status_buf):
                        poller.register(status_fd, select.POLLIN)
                        tags[status_fd] = "status"
                elif what == "in" and stdin is not None:
                    try:
                        n = os.write(stdin, view[:_CHUNK]) if view else 0
                    except BrokenPipeError:
                        n, view = 0, memoryview(b"")
                    view = view[n:]
                    if not view:
                        drop(stdin)
                        os.close(stdin)
                        stdin = None
                elif what == "status":
                    if _read_ready(fd, status_buf):
                        drop(fd)
                else:
                    try:
                        data = os.read(fd, _CHUNK)
                    except OSError as e:
                        if e.errno == errno.EAGAIN:
                            continue
                        data = b""
                    if not data:
                        drop(fd)
                    else:
                        (out if what == "out" else err).feed(data)
                        if on_output is not None:
                            on_output("stdout" if what == "out" else "stderr", data)
            if exited and not any(t in ("out", "err", "status") for t in tags.values()):
                break
    finally:
        os.close(pidfd)
        if stdin is not None:
            with contextlib.suppress(OSError):
                os.close(stdin)
    if not exited:
        on_exit()
        if status_fd is not None:  # what the launchers wrote before the wait was cut short
            _read_ready(status_fd, status_buf)
    _, status, ru = os.wait4(pid, 0)
    result.status = status
    result.rusage_cpu_ms = int((ru.ru_utime + ru.ru_stime) * 1000)
    result.rusage_written = ru.ru_oublock * 512
    result.status_json = bytes(status_buf)
    return result
