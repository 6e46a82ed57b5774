"""The docker executor's per-call disk write quota (``disk_write_bytes``): the proc
executors' write watchdog (plugins/executor_proc/writewatch.py) over the container's cgroup.

Why not a size-limited writable layer: ``--storage-opt size`` needs overlay2 on XFS with
project quotas (this host's docker root is ext4), and the call's ``work`` directory is a host
bind that no container option bounds. The kernel's per-task ``write_bytes`` counts both: the
overlay's upper layer and the bind are written by the container's processes. A run-once
container lives under a cgroup parent of its own (cpu.py), so its members are exactly the
call's processes; a warm container's commands run one at a time, and what its processes had
written before the call does not count.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

from plugins.executor_docker.cpu import ROOT
from plugins.executor_proc.writewatch import WriteWatch, cgroup_members

_V1 = ("pids", "cpuacct", "cpu,cpuacct", "cpuacct,cpu", "memory")


def _members(cgroup: str, nested: bool) -> Callable[[], list[int]]:
    """The processes of ``cgroup`` (and, ``nested``, its child groups: a run-once parent's
    container), in the first hierarchy that has it (found at the first sample that can)."""
    rel = cgroup.strip("/")
    bases = [str(ROOT / name / rel) for name in _V1] + [str(ROOT / rel)]
    found: list[Callable[[], list[int]]] = []

    def members() -> list[int]:
        if not found:
            for base in bases:
                if os.path.isfile(os.path.join(base, "cgroup.procs")):
                    found.append(cgroup_members([os.path.join(base, "cgroup.procs")],
                                                nested=nested))
                    break
            else:
                return []  # not created yet: the container is starting
        return found[0]()

    return members


def kill_members(cgroup_parent: str) -> int:
    """SIGKILL every process under a run-once parent (its container's, runc's start-up among
    them: a container still starting does not answer the engine's kill); how many."""
    pids = _members(cgroup_parent, nested=True)()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def watch_run_once(limit: int, cgroup_parent: str, kill: Callable[[], object]) -> WriteWatch:
    """Watch a run-once container under its own ``cgroup_parent``; ``kill`` kills it."""
    return WriteWatch(limit, _members(cgroup_parent, nested=True), kill).start()


def watch_warm(limit: int, cgroup: str, kill: Callable[[], object]) -> WriteWatch:
    """Watch one command in a warm container (its ``cgroup``): the processes already there
    count from now."""
    members = _members(cgroup, nested=False)
    return WriteWatch(limit, members, kill).start(members())
