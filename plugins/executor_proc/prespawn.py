"""Launchers spawned ahead of time, each already inside its own fresh per-exec cgroup.

Moving a task into a cgroup takes the kernel's threadgroup lock for writing, which waits for an
RCU grace period (5–15 ms here) unless the hierarchy is mounted ``favordynmods``; forking a large
Python process costs another few ms. Both are paid here, in a background thread, before a call
needs them: a held native launcher (``sb_launch -H``) has joined its cgroup and sits blocked on
its control pipe with its stdout/stderr/status pipes ready. A call writes its command (cwd,
environment, options, argv) to the pipe and the launcher applies rlimits, Landlock and seccomp and
execs, exactly as a freshly spawned one would. A held launcher runs nothing but itself until
then, and the pipe is the engine's alone; when the engine exits the pipe closes and it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass

from plugins.executor_proc import cgroups, native, pidfd_exit


@dataclass(slots=True)
class Held:
    """One launcher waiting for its command."""

    proc: subprocess.Popen[bytes]
    ctl: int  # write end of its control pipe
    status_r: int
    status_fd: int  # the status pipe's number inside the launcher
    cg: cgroups.ExecCgroup | None
    # the engine's end of the socket the launcher's ``-W`` sends the tool's pidfd on, and that
    # socket's number inside the launcher (pidfd_exit.py); None without the kernel's support
    end: socket.socket | None = None
    end_fd: int = -1

    def send(self, cwd: str, env: dict[str, str], args: list[str]) -> None:
        """Hand over the command; raises OSError when the launcher is gone."""
        parts = [cwd, *(f"{k}={v}" for k, v in env.items()), "", *args]
        # os.fsencode of each part, at once (UTF-8 with surrogateescape on Linux)
        data = memoryview(("\0".join(parts) + "\0").encode(ENCODING, "surrogateescape"))
        try:
            while data:
                data = data[os.write(self.ctl, data):]
        finally:
            os.close(self.ctl)
            self.ctl = -1

    def discard(self, pool: cgroups.CgroupPool | None) -> None:
        """Close it unused: EOF tells the launcher to exit; reap it, release its group."""
        if self.ctl >= 0:
            os.close(self.ctl)
            self.ctl = -1
        for fh in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        os.close(self.status_r)
        if self.end is not None:
            self.end.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        if self.cg is not None:
            if pool is not None:
                pool.release(self.cg)
            else:
                self.cg.remove()


def spawn(exe: str, cg: cgroups.ExecCgroup | None, *, end: bool = False) -> Held:
    """Start a held launcher inside ``cg`` (joined by the launcher itself, before it waits);
    ``end``: with a socket for the tool's pidfd (``-W``, ``pidfd_exit.py``)."""
    ctl_r, ctl_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    end_r: socket.socket | None = None
    end_w: socket.socket | None = None
    end_fd = -1
    cg_fds: list[int] = []
    try:  # the socket pair too: the pipes are closed whatever fails
        if end:
            end_r, end_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            end_fd = end_w.fileno()
        cg_fds = [os.open(f, os.O_WRONLY | os.O_CLOEXEC) for f in (cg.procs_files if cg else [])]
        # the checked descriptor is executed, never the name (a swap after the check runs
        # nothing); the launcher closes it (`-x`) first
        cg_fds.append(native.open_verified(exe))
        argv = [exe, "-x", str(cg_fds[-1]), *(a for fd in cg_fds[:-1] for a in ("-c", str(fd))),
                "-H", str(ctl_r)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={}, cwd="/", start_new_session=True,
                                pass_fds=(ctl_r, status_w, *cg_fds,
                                          *([end_fd] if end_w is not None else [])),
                                executable=f"/proc/self/fd/{cg_fds[-1]}", close_fds=True)
    except OSError:
        os.close(ctl_w)
        os.close(status_r)
        if end_r is not None:
            end_r.close()
        raise
    finally:
        for fd in (ctl_r, status_w, *cg_fds):
            os.close(fd)
        if end_w is not None:
            end_w.close()
    return Held(proc, ctl_w, status_r, status_w, cg, end_r, end_fd)


class LauncherPool:
    """Keeps ``size`` held launchers ready; ``take`` hands one out (spawning one if none is)."""

    def __init__(self, exe: str, cgroup_pool: cgroups.CgroupPool | None, size: int) -> None:
        self.exe = exe
        self.cgroup_pool = cgroup_pool
        self.size = size
        self._ready: list[Held] = []
        self._limits: tuple[int, int, float] | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._wanted = True
        self.pidfd_end = pidfd_exit.supported()  # the launchers' -W: no fork to report the end

    def _group(self, limits: tuple[int, int, float] | None) -> cgroups.ExecCgroup | None:
        if self.cgroup_pool is None or limits is None:
            return None
        return self.cgroup_pool.acquire(*limits)

    def take(self, pids: int, memory_bytes: int, cpu_cores: float) -> Held:
        """A launcher whose cgroup (if any) now holds these limits.

        :raises OSError: a launcher could not be spawned.
        """
        limits = (pids, memory_bytes, cpu_cores)
        with self._cond:
            self._limits = limits
            held = self._ready.pop() if self._ready else None
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._work, daemon=True,
                                                name="policy-engine-prespawn")
                self._thread.start()
                _POOLS.add(self)
            # no refill yet: a spawn now would join its cgroup (an RCU grace period during which
            # every fork waits) just as this call's bwrap forks; ``refill`` runs after the call
        if held is not None and held.proc.poll() is None:
            if held.cg is None:  # cgroups off or unavailable here: rlimits only
                return held
            try:
                cgroups.configure(held.cg, limits)
                return held
            except OSError:
                pass
        if held is not None:
            held.discard(self.cgroup_pool)
        return spawn(self.exe, self._group(limits), end=self.pidfd_end)

    def refill(self) -> None:
        """Called when a call has finished: top the pool up in the background."""
        with self._cond:
            self._wanted = True
            self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (len(self._ready) >= self.size or not (
                        self._wanted or not self._ready)):
                    self._cond.wait()
                if self._closed:
                    return
                limits = self._limits
                self._wanted = len(self._ready) + 1 < self.size
                spare = bool(self._ready)
            if spare:  # not needed at once: let the call that woke us finish its answer first
                time.sleep(SETTLE_S)
            try:
                held = spawn(self.exe, self._group(limits), end=self.pidfd_end)
            except OSError:
                with self._cond:
                    self._cond.wait(1.0)  # cannot spawn right now; take() spawns itself
                continue
            with self._cond:
                if self._closed:
                    held.discard(self.cgroup_pool)
                    return
                self._ready.append(held)

    def close(self) -> None:
        """Stop refilling; every held launcher gets EOF and exits."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(30)
        with self._cond:
            ready, self._ready = self._ready, []
        for held in ready:
            held.discard(self.cgroup_pool)
        _POOLS.discard(self)


SETTLE_S = 0.002
"""How long a refill (a spawn, a cgroup join) waits after the call that asked for it, while a
launcher is still held: the call's caller is still building its answer then (evidence, budget:
~1 ms; a woken thread preempts it and takes the GIL); short, so that the join's RCU grace
period (every fork on the host waits) ends well before a next call 20 ms on. An empty pool is
refilled at once."""

ENCODING = sys.getfilesystemencoding()

_POOLS: weakref.WeakSet[LauncherPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:  # registered after cgroups' hook, so it runs before it
    for pool in list(_POOLS):
        pool.close()
