"""`--max-concurrent-execs` across worker processes: one ``flock``-ed file per slot.

A thread semaphore counts the execs of one process; with ``serve --workers N`` that would let
N times as many run. A slot here is an exclusive ``flock`` on one of ``limit`` files under the
state directory: every worker (and every thread, each with its own open file) competes for the
same files, and the kernel frees a slot when its holder exits, however it dies, so a crashed
worker never leaks one. Servers sharing a state directory share the cap.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_POLL_S = (0.005, 0.01, 0.02, 0.05, 0.1)  # waiting for a slot: back off up to 100 ms


class ExecSlots:
    """At most ``limit`` holders at once among every process using ``directory``."""

    def __init__(self, directory: Path, limit: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.limit = limit
        self.paths = [directory / f"slot-{i}.lock" for i in range(limit)]
        for path in self.paths:
            path.touch(exist_ok=True)

    def _try_take(self) -> int | None:
        """An fd holding one free slot, or ``None`` when all are held."""
        for path in self.paths:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return fd
        return None

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Wait for a slot and hold it for the ``with`` block (the exec)."""
        attempt = 0
        fd = self._try_take()
        while fd is None:
            time.sleep(_POLL_S[min(attempt, len(_POLL_S) - 1)])
            attempt += 1
            fd = self._try_take()
        try:
            yield
        finally:
            os.close(fd)  # closing the only fd of the open file releases the lock
