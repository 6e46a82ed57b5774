"""CPU time of docker executions from the kernel's cgroup accounting, never wall time.

A run-once container starts under a cgroup parent of its own (``cgroup_parent``): the container's
cgroup is removed when it exits, but CPU usage is charged to every ancestor as it accrues (v1
``cpuacct.usage``; v2 ``cpu.stat`` ``usage_usec`` keeps the usage of removed children), so the
parent still holds the total after the exit; it is removed after reading. A warm container's
command is measured as the growth of the container's own cgroup while it ran (its commands
run one at a time).

Returns ``None`` where the cgroup file system is not readable (a remote docker host); the
executor then reports wall time times the CPU quota, an upper bound, and says so.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_V1_DIRS = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")


def parent_for(exec_id: str) -> str:
    """The cgroup parent of one run-once execution (a name docker creates on demand)."""
    safe = "".join(c for c in exec_id if c.isalnum() or c in "-_")
    return f"/policy-engine-docker-{safe}"


def usage_ns(cgroup: str) -> int | None:
    """Total CPU time charged to ``cgroup`` (a path from the hierarchy root), or ``None``."""
    rel = cgroup.strip("/")
    for name in _V1_DIRS:
        path = ROOT / name / rel / "cpuacct.usage"
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
    with contextlib.suppress(OSError, ValueError):
        for line in (ROOT / rel / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1000
    return None


def remove_parent(cgroup: str) -> None:
    """Remove a run-once parent from every hierarchy (its child is gone with the container)."""
    rel = cgroup.strip("/")
    if not rel.startswith("policy-engine-docker-"):
        return  # INVARIANT: only ever remove what ``parent_for`` named
    with contextlib.suppress(OSError):
        for controller in os.listdir(ROOT):
            with contextlib.suppress(OSError):
                (ROOT / controller / rel).rmdir()
    with contextlib.suppress(OSError):
        (ROOT / rel).rmdir()


def of_process(pid: int, controller: str = "cpuacct") -> str | None:
    """The cgroup of ``pid`` that ``controller`` charges (v1; else the v2 one): by default
    the one CPU time is charged to."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
        if controllers == "":
            unified = path
    return unified
