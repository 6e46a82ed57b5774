"""Per-exec cgroups (v1 per-controller, or v2 when delegated) for pids, memory and cpu.

Each exec gets ``policy-engine-<hex>`` beneath this process's own cgroup of each controller, so
a sandbox stays inside whatever limits the engine itself runs under. RLIMIT_NPROC is no
substitute: it is per user and the kernel ignores it for root.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
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


@dataclass(slots=True)
class ExecCgroup:
    """The cgroup directories of one exec; ``procs_files`` are written by the child pre-exec."""

    version: str
    dirs: dict[str, str] = field(default_factory=dict)

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    @property
    def controllers(self) -> list[str]:
        return sorted(self.dirs)

    def pids(self) -> list[int]:
        """Members of the pids (else any) group: the set to kill."""
        d = self.dirs.get("pids") or next(iter(self.dirs.values()), None)
        if d is None:
            return []
        try:
            with open(os.path.join(d, "cgroup.procs")) as fh:
                return [int(x) for x in fh.read().split()]
        except OSError:
            return []

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every member until the group is empty (a bomb refills, so loop)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            members = self.pids()
            if not members:
                return True
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        return not self.pids()

    def memory_peak(self) -> int | None:
        d = self.dirs.get("memory")
        if d is None:
            return None
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            with contextlib.suppress(OSError), open(os.path.join(d, name)) as fh:
                return int(fh.read().split()[0])
        return None

    def cpu_ms(self) -> int | None:
        """CPU time of every task that ran in the group (rusage misses bwrap's grandchildren)."""
        d = self.dirs.get("cpuacct")
        with contextlib.suppress(OSError):
            if d is not None:
                with open(os.path.join(d, "cpuacct.usage")) as fh:
                    return int(fh.read()) // 1_000_000
            if self.version == "v2":
                with open(os.path.join(self.dirs["pids"], "cpu.stat")) as fh:
                    for line in fh:
                        if line.startswith("usage_usec"):
                            return int(line.split()[1]) // 1000
        return None

    def remove(self) -> None:
        """Kill leftovers and rmdir; retried because exiting tasks leave the group lazily."""
        self.kill_all()
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


def create(pids: int, memory_bytes: int, cpu_cores: float) -> ExecCgroup | None:
    """Make and configure the groups; ``None`` when not possible (rlimits only then)."""
    version = detect()
    if version is None:
        return None
    own, name = _own_paths(), PREFIX + secrets.token_hex(6)
    cg = ExecCgroup(version)
    try:
        if version == "v1":
            for ctrl in ("pids", "memory", "cpu", "cpuacct"):
                base = os.path.join(ROOT, ctrl) + own.get(ctrl, "/")
                if ctrl in own and _writable_dir(base):
                    os.mkdir(os.path.join(base, name), 0o755)
                    cg.dirs[ctrl] = os.path.join(base, name)
            _write(os.path.join(cg.dirs["pids"], "pids.max"), str(pids))
            if "memory" in cg.dirs:
                _write(os.path.join(cg.dirs["memory"], "memory.limit_in_bytes"), str(memory_bytes))
            if "cpu" in cg.dirs:
                _write(os.path.join(cg.dirs["cpu"], "cpu.cfs_period_us"), "100000")
                _write(os.path.join(cg.dirs["cpu"], "cpu.cfs_quota_us"),
                       str(max(1000, int(cpu_cores * 100000))))
        else:
            d = os.path.join(ROOT + own[""], name)
            os.mkdir(d, 0o755)
            cg.dirs["pids"] = d
            _write(os.path.join(d, "pids.max"), str(pids))
            with contextlib.suppress(OSError):  # only if those controllers are delegated
                _write(os.path.join(d, "memory.max"), str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(os.path.join(d, "cpu.max"), f"{max(1000, int(cpu_cores * 100000))} 100000")
    except OSError:
        cg.remove()
        return None
    return cg


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
