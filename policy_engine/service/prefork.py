"""`serve --workers N`: N worker processes forked after start-up, all accepting on one socket.

The parent validates everything (policy, config, manifests, stores: ``open_engine``), closes
what it opened, binds the socket once and forks. Each worker opens its own engine (SQLite
connections and threads do not survive a fork) and runs a uvicorn server on the inherited
socket; the kernel hands each new connection to one of them.

* SIGTERM or SIGINT to the parent is forwarded to every worker; uvicorn stops accepting, lets
  the requests in flight finish, closes its engine and exits; the parent exits once all have.
* A worker that dies otherwise is reported on stderr and replaced; more than
  ``MAX_RESTARTS`` deaths within ``RESTART_WINDOW_S`` stop the server (exit 1): a worker that
  cannot start would otherwise be forked forever.
* A worker whose parent dies gets SIGTERM (``PR_SET_PDEATHSIG``): no orphans serve on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType

MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
_PR_SET_PDEATHSIG = 1


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when the parent dies (Linux); exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the getppid check below still runs
        pass
    if os.getppid() != parent:
        os._exit(0)


class Supervisor:
    """Forks and watches the workers; ``run`` returns the parent's exit status."""

    def __init__(self, workers: int, run_worker: Callable[[int], int],
                 say: Callable[[str], None]) -> None:
        """:param run_worker: serves in a freshly forked worker (its index) until it is told
            to stop; returns the worker's exit status."""
        self.workers = workers
        self.run_worker = run_worker
        self.say = say
        self.children: dict[int, int] = {}  # pid -> worker index
        self.stopping = False
        self.deaths: list[float] = []

    def spawn(self, index: int) -> None:
        parent = os.getpid()
        if threading.active_count() > 1:  # a thread's lock held at fork stays held forever
            self.say(f"warning: forking worker {index} with {threading.active_count() - 1} "
                     "other thread(s) running")
        sys.stdout.flush()  # or the child would write the parent's buffered output again
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # uvicorn installs its own
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                _die_with_parent(parent)
                code = self.run_worker(index)
            except BaseException:  # noqa: BLE001 — reported, then this process ends
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children[pid] = index
        if self.stopping:  # the signal came while this one was being forked
            os.kill(pid, signal.SIGTERM)

    def _forward(self, _signum: int, _frame: FrameType | None) -> None:
        """SIGTERM or SIGINT: every worker gets SIGTERM (uvicorn's graceful stop)."""
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):  # it is being reaped
                os.kill(pid, signal.SIGTERM)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for index in range(self.workers):
                self.spawn(index)
            status = 0
            while self.children:
                pid, raw = os.wait()
                index = self.children.pop(pid, -1)
                if index < 0:
                    continue
                if self.stopping:
                    # uvicorn stops gracefully, then raises the signal it caught again with
                    # the default action: SIGTERM is how a worker that was told to stop ends
                    clean = raw == 0 or (os.WIFSIGNALED(raw) and os.WTERMSIG(raw) in (
                        signal.SIGTERM, signal.SIGINT))
                    if not clean:
                        self.say(f"worker {index} (pid {pid}) {_describe(raw)} while stopping")
                    continue
                now = time.monotonic()
                self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW_S] + [now]
                if len(self.deaths) > MAX_RESTARTS:
                    self.say(f"error: worker {index} (pid {pid}) {_describe(raw)}; "
                             f"{len(self.deaths)} workers died within {RESTART_WINDOW_S:g} s; "
                             "stopping the server")
                    status = 1
                    self._forward(signal.SIGTERM, None)
                    continue
                self.say(f"worker {index} (pid {pid}) {_describe(raw)}; starting another")
                self.spawn(index)
            return status
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def serve_workers(sock: socket.socket, workers: int, run_worker: Callable[[int], int],
                  say: Callable[[str], None]) -> int:
    """Run ``workers`` forked workers on ``sock`` until SIGTERM/SIGINT; the exit status."""
    try:
        return Supervisor(workers, run_worker, say).run()
    finally:
        sock.close()
