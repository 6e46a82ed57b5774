"""Per-exec cgroups (v1 per-controller, or v2 when delegated) for pids, memory and cpu.

Each exec gets ``policy-engine-<hex>`` beneath this process's own cgroup of each controller, so
a sandbox stays inside whatever limits the engine itself runs under. RLIMIT_NPROC is no
substitute: it is per user and the kernel ignores it for root.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import select
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field

ROOT = "/sys/fs/cgroup"
PREFIX = "policy-engine-"


def _own_paths() -> dict[str, str]:
    """controller → this process's cgroup path (``""`` key: the v2 unified hierarchy)."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


_READ = os.O_RDONLY | os.O_CLOEXEC
# role → (key in ``ExecCgroup.dirs``, file) of what a call reads after its tool exits; every v2
# file is in the one unified group, which ``dirs`` holds under "pids"
_FILES = {
    "v1": {"peak": ("memory", "memory.max_usage_in_bytes"), "oom": ("memory", "memory.oom_control"),
           "cpu": ("cpuacct", "cpuacct.usage")},
    "v2": {"peak": ("pids", "memory.peak"), "oom": ("pids", "memory.events"),
           "cpu": ("pids", "cpu.stat")},
}


def _pread_all(fd: int, *, records: bool = False) -> bytes:
    """The whole file from offset 0 (a kernfs file shows its state anew at offset 0). A counter
    file is one record, which the kernel never splits across reads, so a short read is all of it;
    a list of ``records`` (``cgroup.procs``) may come one buffer at a time: read on until EOF."""
    data = os.pread(fd, 4096, 0)
    if not data or (len(data) < 4096 and not records):
        return data
    chunks, off = [data], len(data)
    while chunk := os.pread(fd, 65536, off):
        chunks.append(chunk)
        off += len(chunk)
    return b"".join(chunks)


def _field(data: bytes, key: bytes) -> int | None:
    """``key value`` lines (``memory.events``, ``memory.oom_control``, ``cpu.stat``)."""
    for line in data.splitlines():
        k, _, value = line.partition(b" ")
        if k == key:
            return int(value)
    return None


@dataclass(slots=True)
class ExecCgroup:
    """The cgroup directories of one exec; ``procs_files`` are written by the child pre-exec.

    ``fds``: read descriptors of the files a call reads after its tool exits, opened with the
    group (``keep_descriptors``, on the pool's thread) so that reading one then costs one
    ``pread`` instead of an open, a buffered read and a close; closed by ``remove``. A role
    without a descriptor (a file this kernel lacks, a group built by hand) is read by its path.
    """

    version: str
    dirs: dict[str, str] = field(default_factory=dict)
    limits: tuple[int, int, float] | None = None  # (pids, memory, cpu) as last written
    fds: dict[str, int] = field(default_factory=dict)  # role → O_RDONLY descriptor

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    @property
    def controllers(self) -> list[str]:
        return sorted(self.dirs)

    def _path(self, role: str) -> str | None:
        if role == "procs":  # the pids (else any) group: the set to kill
            d = self.dirs.get("pids") or next(iter(self.dirs.values()), None)
            return None if d is None else os.path.join(d, "cgroup.procs")
        key, name = _FILES[self.version][role]
        d = self.dirs.get(key)
        return None if d is None else os.path.join(d, name)

    def keep_descriptors(self) -> None:
        """Open the files read after an exec now, off the call's path (missing ones are
        skipped: read by path, they answer as before)."""
        for role in ("procs", *_FILES[self.version]):
            path = self._path(role)
            if path is not None and role not in self.fds:
                with contextlib.suppress(OSError):
                    self.fds[role] = os.open(path, _READ)

    def close_descriptors(self) -> None:
        while self.fds:
            _, fd = self.fds.popitem()
            with contextlib.suppress(OSError):
                os.close(fd)

    def _read(self, role: str) -> bytes | None:
        """The file of ``role`` as it is now; ``None`` when it cannot be read."""
        fd = self.fds.get(role)
        if fd is not None:
            with contextlib.suppress(OSError):
                return _pread_all(fd)
        return self._read_path(role)

    def _read_path(self, role: str, *, records: bool = False) -> bytes | None:
        path = self._path(role)
        if path is None:
            return None
        try:
            fd = os.open(path, _READ)
        except OSError:
            return None
        try:
            return _pread_all(fd, records=records)
        except OSError:
            return None
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        """Members of the pids (else any) group: the set to kill."""
        # ``cgroup.procs`` through the kept descriptor once only: v1 loads the pid list at an
        # open file's first read and hands that same list to its later reads for as long as
        # they come less than a second apart (cgroup_pidlist_start), so a re-read would show
        # the group as it was (tested). Later reads open the file anew. v2 restarts its walk
        # at offset 0, but one rule for both keeps the untestable-here path the tested one.
        # dict.pop is atomic: of two threads, one gets the descriptor, the other the path.
        fd = self.fds.pop("procs", None)
        data = None
        if fd is not None:
            try:
                data = _pread_all(fd, records=True)
            except OSError:
                pass
            finally:
                os.close(fd)
        if data is None:
            data = self._read_path("procs", records=True)
        try:
            return [int(x) for x in data.split()] if data is not None else []
        except ValueError:
            return []

    def kill_once(self) -> None:
        """SIGKILL every member listed now, without waiting (``kill_all`` waits)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every member until the group is empty (a bomb refills, so loop)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            members = self.pids()
            if not members:
                return True
            fds = []
            for pid in members:
                with contextlib.suppress(OSError):  # gone already, or not ours to see
                    fds.append(os.pidfd_open(pid))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                # members are usually already exiting: wake as soon as one has left (a pidfd
                # turns readable after the kernel took it out of its cgroups), else in 5 ms
                if fds:
                    select.select(fds, [], [], 0.005)
                else:
                    time.sleep(0.0005)
            finally:
                for fd in fds:
                    os.close(fd)
        return not self.pids()

    def memory_peak(self) -> int | None:
        """The group's memory high-water mark in bytes (v1 ``memory.max_usage_in_bytes``,
        v2 ``memory.peak``); ``None`` without a memory group."""
        data = self._read("peak")
        with contextlib.suppress(ValueError, IndexError):
            return int(data.split()[0]) if data is not None else None
        return None

    def oom_kills(self) -> int:
        """How many tasks of the group the memory controller's OOM killer ended (v1
        ``memory.oom_control``, v2 ``memory.events``); 0 when there is no memory group."""
        data = self._read("oom")
        with contextlib.suppress(ValueError):
            return (_field(data, b"oom_kill") or 0) if data is not None else 0
        return 0

    def cpu_ms(self) -> int | None:
        """CPU time of every task that ran in the group (rusage misses bwrap's grandchildren)."""
        data = self._read("cpu")
        if data is None:
            return None
        with contextlib.suppress(ValueError):
            if self.version == "v1":
                return int(data) // 1_000_000
            usec = _field(data, b"usage_usec")
            return None if usec is None else usec // 1000
        return None

    def remove(self) -> None:
        """Kill leftovers and rmdir; retried because exiting tasks leave the group lazily.
        The descriptors are closed first (they would not keep rmdir from working, but a
        thousand calls would leak a thousand of them)."""
        try:
            self.kill_all()
        finally:
            self.close_descriptors()
        for d in self.dirs.values():
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def detect() -> str | None:
    """``"v1"`` / ``"v2"`` when a per-exec pids group can be made here, else ``None``."""
    own = _own_paths()
    if "pids" in own and _writable_dir(os.path.join(ROOT, "pids") + own["pids"]):
        return "v1"
    if "" in own:
        base = ROOT + own[""]
        try:
            with open(os.path.join(base, "cgroup.subtree_control")) as fh:
                if "pids" in fh.read().split() and _writable_dir(base):
                    return "v2"
        except OSError:
            return None
    return None


def configure(cg: ExecCgroup, limits: tuple[int, int, float]) -> None:
    """Write the limits a group does not already hold (a pooled group usually holds them)."""
    if cg.limits == limits:
        return
    pids, memory_bytes, cpu_cores = limits
    cg.limits = None  # half-written until the end
    quota = str(max(1000, int(cpu_cores * 100000)))
    if cg.version == "v1":
        _write(os.path.join(cg.dirs["pids"], "pids.max"), str(pids))
        if "memory" in cg.dirs:
            _write(os.path.join(cg.dirs["memory"], "memory.limit_in_bytes"), str(memory_bytes))
        if "cpu" in cg.dirs:
            _write(os.path.join(cg.dirs["cpu"], "cpu.cfs_period_us"), "100000")
            _write(os.path.join(cg.dirs["cpu"], "cpu.cfs_quota_us"), quota)
    else:
        d = cg.dirs["pids"]
        _write(os.path.join(d, "pids.max"), str(pids))
        with contextlib.suppress(OSError):  # only if those controllers are delegated
            _write(os.path.join(d, "memory.max"), str(memory_bytes))
        with contextlib.suppress(OSError):
            _write(os.path.join(d, "cpu.max"), f"{quota} 100000")
    cg.limits = limits


def _make(version: str, own: dict[str, str]) -> ExecCgroup:
    """mkdir one fresh group per controller; raises OSError (after cleaning up)."""
    name = PREFIX + secrets.token_hex(6)
    cg = ExecCgroup(version)
    try:
        if version == "v1":
            for ctrl in ("pids", "memory", "cpu", "cpuacct"):
                base = os.path.join(ROOT, ctrl) + own.get(ctrl, "/")
                if ctrl in own and _writable_dir(base):
                    os.mkdir(os.path.join(base, name), 0o755)
                    cg.dirs[ctrl] = os.path.join(base, name)
            if "pids" not in cg.dirs:
                raise OSError("no pids controller")
        else:
            d = os.path.join(ROOT + own[""], name)
            os.mkdir(d, 0o755)
            cg.dirs["pids"] = d
        cg.keep_descriptors()
    except OSError:
        cg.remove()
        raise
    return cg


def create(pids: int, memory_bytes: int, cpu_cores: float) -> ExecCgroup | None:
    """Make and configure the groups; ``None`` when not possible (rlimits only then)."""
    version = detect()
    if version is None:
        return None
    try:
        cg = _make(version, _own_paths())
    except OSError:
        return None
    try:
        configure(cg, (pids, memory_bytes, cpu_cores))
    except OSError:
        cg.remove()
        return None
    return cg


SETTLE_S = 0.002
"""How long removing a used group waits after its call released it (the call is building its
answer then; nothing waits for the removal)."""


class CgroupPool:
    """Fresh per-exec groups made ahead of time, and removed after use, off the hot path.

    Every exec still gets a group of its own that no other exec has used (so the memory peak
    and CPU time read afterwards are that exec's alone); what moves to a background thread is
    the mkdir before and the kill-wait-rmdir after (exiting tasks leave a group lazily, so
    rmdir has to be retried). Groups are made lazily on first use, ``size`` ahead, and written
    with the last limits asked for, so ``acquire`` usually writes nothing.
    """

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self.version = detect()
        self._own = _own_paths() if self.version else {}
        self._free: list[ExecCgroup] = []
        self._dead: list[ExecCgroup] = []
        self._limits: tuple[int, int, float] | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def acquire(self, pids: int, memory_bytes: int, cpu_cores: float) -> ExecCgroup | None:
        """A configured group for one exec; ``None`` when groups cannot be made here."""
        if self.version is None:
            return None
        limits = (pids, memory_bytes, cpu_cores)
        with self._cond:
            self._limits = limits
            cg = self._free.pop() if self._free else None
            self._start()
            self._cond.notify()
        try:
            if cg is None:
                cg = _make(self.version, self._own)
            configure(cg, limits)
        except OSError:  # e.g. swept by another engine: one fresh try, else rlimits only
            if cg is not None:
                self.release(cg)
            return create(pids, memory_bytes, cpu_cores)
        return cg

    def release(self, cg: ExecCgroup) -> None:
        """Hand a used group to the background thread to empty and remove."""
        with self._cond:
            if self._closed or self._thread is None:
                cg.remove()
                return
            self._dead.append(cg)
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._work, name="policy-engine-cgroups",
                                            daemon=True)
            self._thread.start()
            _POOLS.add(self)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._dead and len(self._free) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
                dead, self._dead = self._dead, []
                limits, short = self._limits, len(self._free) < self.size
            if dead:  # after the call that released it has built its answer (prespawn.py)
                time.sleep(SETTLE_S)
            for cg in dead:
                cg.remove()
            if short and self.version is not None:
                try:
                    cg = _make(self.version, self._own)
                    if limits is not None:
                        configure(cg, limits)
                except OSError:
                    time.sleep(1.0)  # cannot make groups right now; acquire falls back
                    continue
                with self._cond:
                    self._free.append(cg)

    def close(self) -> None:
        """Stop the thread and remove every group still held (idle or awaiting removal)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(30)
        with self._cond:
            left, self._free, self._dead = self._free + self._dead, [], []
        for cg in left:
            cg.remove()
        _POOLS.discard(self)


_POOLS: weakref.WeakSet[CgroupPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS):
        pool.close()


def sweep_stale(min_age_s: float = 600.0) -> int:
    """Remove empty per-exec groups a crashed engine left behind; returns how many.

    Only groups older than ``min_age_s``: a young empty group may belong to a concurrent engine
    that has not attached its child yet.
    """
    own, removed, now = _own_paths(), 0, time.time()
    bases = [os.path.join(ROOT, c) + p for c, p in own.items() if c] + (
        [ROOT + own[""]] if "" in own else [])
    for base in bases:
        with contextlib.suppress(OSError):
            for name in os.listdir(base):
                path = os.path.join(base, name)
                if name.startswith(PREFIX) and now - os.stat(path).st_mtime > min_age_s:
                    with contextlib.suppress(OSError):
                        os.rmdir(path)  # EBUSY while still in use
                        removed += 1
    return removed
