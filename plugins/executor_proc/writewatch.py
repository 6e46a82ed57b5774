"""The per-call disk write quota (``disk_write_bytes``): a watchdog summing what the call's
processes wrote, killing the call when the sum passes the limit (issue 32 item 2).

Why this measure: ``RLIMIT_FSIZE`` bounds each file, not how many there are, and seccomp
refuses the preallocating ``fallocate`` modes, but a call could still fill the disk with many
files. The kernel's per-task I/O accounting (``/proc/PID/io`` ``write_bytes``) counts the bytes
a task causes to be written to storage when it dirties the page cache (buffered writes, shared
mmap writes and direct I/O alike), on whatever file system — the workspace bind, the private
tmp directory, Docker's overlay upper layer. A reaped process's counts are added to the
process that reaped it (``wait_task_zombie``), so the sum over the call's live processes
never forgets the exited ones as long as their reaper is one of them (bwrap's pid 1, the
tool, a container's init). No tree is walked, no file system is measured: one sample reads
two small ``/proc`` files per process of the call.

Not counted: tmpfs (page cache only; a sandbox's own ``/tmp`` tmpfs is charged to its memory
cgroup) and pages rewritten before they were written back (the same bytes, not more disk).

The overshoot is bounded by the write rate times ``INTERVAL_S``; after the call the
executor checks the exact total of the reaped tree (``wait4``'s ``ru_oublock``) too.
Overwriting counts again (a write budget, like the other byte limits), truncation gives
nothing back.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plugins.executor_proc.cgroups import ExecCgroup

INTERVAL_S = 0.01
"""Shortest sample period: a call writing 1 GB/s overshoots its quota by about 10 MB."""

PACE_BYTES_PER_S = 8 * 10**9
MAX_INTERVAL_S = 0.25
"""Far from its quota a call is sampled less often: the next sample comes when a writer at
``PACE_BYTES_PER_S`` (past what page-cache writes reach on 2–8 cores) could have used what is
left, never later than ``MAX_INTERVAL_S``. A sample reads two ``/proc`` files per process, so
every 10 ms across four calls of 240 processes each cost the engine 57 % of a core (outsider
attack 36); under the 2 GiB default a call is sampled every 0.25 s until it has written most of
it. The overshoot bound is unchanged: the rate times ``INTERVAL_S`` near the quota."""

WATCH_NICE = -10
"""The sampling thread's nice value (root only): scheduled ahead of the call it watches."""

MAX_PIDS = 4096
"""Processes read per sample, at most (the pids limit bounds a call far below this)."""


def available() -> bool:
    """Whether the kernel keeps per-task I/O accounting (``CONFIG_TASK_IO_ACCOUNTING``)."""
    return os.path.exists("/proc/self/io")


def written(pid: int) -> int | None:
    """``write_bytes`` of ``pid`` (its thread group and the children it reaped), or ``None``
    when it is gone or cannot be read."""
    try:  # raw: three syscalls, not the nine of a buffered file object (every call reads one)
        fd = os.open(f"/proc/{pid}/io", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    for line in data.splitlines():
        if line.startswith(b"write_bytes:"):
            return int(line.split(b":", 1)[1])
    return None


def tree(root: int) -> list[int]:
    """``root`` and its descendants, through ``/proc/PID/task/TID/children`` (no scan of
    ``/proc``); bounded by ``MAX_PIDS``."""
    out: list[int] = []
    todo = [root]
    while todo and len(out) < MAX_PIDS:
        pid = todo.pop()
        out.append(pid)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), \
                        open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    todo.extend(int(c) for c in fh.read().split())
    return out


def cgroup_members(procs_files: Iterable[str], *, nested: bool = True
                   ) -> Callable[[], list[int]]:
    """The processes of a cgroup (``cgroup.procs`` of it and, ``nested``, of its child
    groups): every process of the call, also one that left the tree by a double fork."""
    files = list(procs_files)

    def members() -> list[int]:
        pids: list[int] = []
        for path in files:
            candidates = [path]
            if nested:
                with contextlib.suppress(OSError), os.scandir(os.path.dirname(path)) as entries:
                    candidates += [os.path.join(e.path, "cgroup.procs") for e in entries
                                   if e.is_dir(follow_symlinks=False)]
            for name in candidates:
                with contextlib.suppress(OSError, ValueError), open(name, "rb") as fh:
                    pids.extend(int(p) for p in fh.read().split())
        return sorted(set(pids))[:MAX_PIDS]

    return members


class WriteWatch:
    """Samples the bytes the call's processes wrote every ``INTERVAL_S``; over ``limit`` it
    calls ``kill`` once and says so (``tripped``). Sampled on a thread of its own, or
    (``start(shared=True)``: the proc executors, one call after another) by the process's one
    sampler thread, which saves a thread start per call. There the sampler sends the signals
    itself (``kill_now``: no wait, no byte more written) and ``kill``, which waits until every
    process is gone, runs on a thread of its own: a slow group kill never delays another
    call's samples."""

    def __init__(self, limit: int, members: Callable[[], list[int]],
                 kill: Callable[[], object], interval_s: float = INTERVAL_S,
                 kill_now: Callable[[], object] | None = None) -> None:
        self.limit = limit
        self._members = members
        self._kill = kill
        self._kill_now = kill_now
        self.interval = interval_s
        self._shortest = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a sample under way and ``stop`` exclude each other
        self._base: dict[int, int] = {}  # what a process had written before the call
        self.used = 0  # the most the call was seen to have written
        self.tripped = False
        self._thread: threading.Thread | None = None
        self._killer: threading.Thread | None = None
        self._shared = False

    def start(self, preexisting: Iterable[int] = (), *, shared: bool = False) -> WriteWatch:
        """Start sampling; ``preexisting`` processes (a held launcher) count from now."""
        for pid in preexisting:
            self._base[pid] = written(pid) or 0
        # the first sample paced as every later one: nothing of the quota is used yet (a
        # short call, most of them, is never sampled: no /proc reads while it starts)
        self.interval = min(MAX_INTERVAL_S, max(self._shortest, self.limit / PACE_BYTES_PER_S))
        self._shared = shared
        if shared:
            _sampler().add(self)
        else:
            self._thread = threading.Thread(target=self._loop, daemon=True, name="write-watch")
            self._thread.start()
        return self

    def tick(self) -> None:
        """One sample; over the limit, ``kill`` once."""
        with self._lock:
            if self.tripped or self._stop.is_set():
                return
            used = self.sample()
            if used <= self.limit:
                self.interval = min(MAX_INTERVAL_S, max(
                    self._shortest, (self.limit - used) / PACE_BYTES_PER_S))
                return
            self.tripped = True
            if self._shared:
                if self._kill_now is not None:
                    with contextlib.suppress(OSError):
                        self._kill_now()
                self._killer = threading.Thread(target=self._kill_quietly, daemon=True,
                                                name="write-watch-kill")
                self._killer.start()
                return
        self._kill_quietly()

    def _kill_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._kill()

    def sample(self) -> int:
        total = 0
        for pid in self._members():
            n = written(pid)
            if n is not None:
                total += max(0, n - self._base.get(pid, 0))
        self.used = max(self.used, total)
        return total

    def _loop(self) -> None:
        _run_ahead()
        while not self._stop.wait(self.interval):
            self.tick()
            if self.tripped:
                return

    def stop(self) -> None:
        """Stop sampling (the call has ended); waits for a sample, or a kill, under way."""
        self._stop.set()
        if self._shared:
            _sampler().remove(self)
        with self._lock:  # a sample under way has ended; none starts after the flag
            pass
        for thread in (self._thread, self._killer):
            if thread is not None and thread.is_alive():
                thread.join()

    def over(self, reaped_bytes: int | None = None) -> bool:
        """Whether the call passed its quota: seen by a sample, or in the exact total of the
        reaped tree (``reaped_bytes``, from ``wait4``) after it ended."""
        if reaped_bytes is not None:
            self.used = max(self.used, reaped_bytes)
        return self.tripped or self.used > self.limit

    def message(self, option: str) -> str:
        return (f"disk write quota exceeded: the call wrote more than its {self.limit}-byte "
                f"`{option}` limit (at least {self.used} bytes) and was killed"
                if self.tripped else
                f"disk write quota exceeded: the call wrote {self.used} bytes, over its "
                f"{self.limit}-byte `{option}` limit")


def _run_ahead() -> None:
    """Give the calling sampler thread nice ``WATCH_NICE``.

    The overshoot is the write rate times the time between samples, and on a loaded machine a
    nice-0 thread waits its turn behind the very writer it watches (96 MB past an 8 MB quota at
    load 8). Linux applies a thread id's nice to that thread only; only root may lower it, and
    without it the watch still runs, less promptly."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WATCH_NICE)


class _Sampler:
    """The one thread that samples every shared watch at its interval; idle (waiting, no
    timer) while no call runs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[WriteWatch, float] = {}
        self._wake_at: float | None = None  # the timed wait under way; None: idle
        self._thread: threading.Thread | None = None

    def add(self, watch: WriteWatch) -> None:
        due = time.monotonic() + watch.interval
        with self._cond:
            self._due[watch] = due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="write-watch")
                self._thread.start()
            elif self._wake_at is None or due < self._wake_at:
                self._cond.notify()

    def remove(self, watch: WriteWatch) -> None:
        with self._cond:
            self._due.pop(watch, None)

    def _loop(self) -> None:
        _run_ahead()
        while True:
            with self._cond:
                now = time.monotonic()
                while not self._due or min(self._due.values()) > now:
                    self._wake_at = min(self._due.values()) if self._due else None
                    self._cond.wait(None if self._wake_at is None else self._wake_at - now)
                    now = time.monotonic()
                self._wake_at = now
                ready = [w for w, t in self._due.items() if t <= now]
                for w in ready:
                    self._due[w] = now + w.interval
            for w in ready:  # outside the lock: a watch's own lock guards its sample
                try:
                    w.tick()
                except Exception:  # noqa: BLE001 - one call's failed sample must not end
                    # the sampling of every other call; the call's own end check (wait4's
                    # exact total) still applies
                    threading.excepthook(threading.ExceptHookArgs(
                        (*sys.exc_info(), threading.current_thread())))


_SAMPLER: list[_Sampler] = []


def _sampler() -> _Sampler:
    if not _SAMPLER:
        with _SAMPLER_LOCK:
            if not _SAMPLER:
                _SAMPLER.append(_Sampler())
    return _SAMPLER[0]


_SAMPLER_LOCK = threading.Lock()


def _forget_sampler_after_fork() -> None:  # its thread and lock states stay in the parent
    global _SAMPLER_LOCK
    _SAMPLER_LOCK = threading.Lock()
    _SAMPLER.clear()


os.register_at_fork(after_in_child=_forget_sampler_after_fork)


def start(limit: int, root: int, cg: ExecCgroup | None, kill: Callable[[], object], *,
          preexisting: bool = False, kill_now: Callable[[], object] | None = None
          ) -> WriteWatch:
    """The proc executors' watch over one call: the tree of ``root`` together with its exec
    cgroup's members (which keep a double-forked process); ``preexisting``: ``root`` is a held
    launcher, started before the call, whose earlier writes do not count. Sampled by the
    shared sampler thread (no thread started per call), which calls ``kill_now`` (signals
    only) itself when the quota is passed, then ``kill`` on a thread of its own."""
    in_group = cgroup_members(cg.procs_files[:1], nested=False) if cg else None

    def members() -> list[int]:
        pids = tree(root)
        if in_group is not None:
            pids = sorted({*pids, *in_group()})[:MAX_PIDS]
        return pids

    return WriteWatch(limit, members, kill, kill_now=kill_now).start(
        [root] if preexisting else [], shared=True)
