"""Bound calls: the call's ``root_fs`` bound read-write at its own path in the container.

A proc.exec whose ``cwd`` lies outside the container's ``/workspace`` runs with exactly the binds
bubblewrap would give it (``guard.binds.bound_paths``: the profile's fs.write prefixes
read-write, its fs.read/fs.list ones read-only, clamped to ``root_fs``), each at its own path:
host path = container path. Sessions use it (docs/sessions.md, "Workspace"): a session's
workspace is one host directory, seen at one path by every call whatever backend runs it, and
by the files API. Each ``root_fs`` gets its own project (``workspace.project_id_of``) and, on a
warm pool, its own container (``pool.WarmPool.acquire_bound``): nothing is shared between two.

The facts of a bound call are the host's (a bind *is* the host directory), read the same way
by the run and by its dry run: the cwd exists beneath a bound path (``cwdfacts``, "docker
view"), each bind is plain (no symlink on the way), and none holds or lies in a path the
container needs for itself, a system bind, or the docker workspace root (whose projects belong
to other tenants).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable

from plugins.executor_proc.cwdfacts import cwd_fact_refusal
from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.guard.binds import bound_paths
from policy_engine.guard.paths import is_beneath, quote
from policy_engine.model import ProcExecOp, Profile

CONTAINER_ROOT = "/workspace"
# what the container's runtime or the engine mounts for itself (netproxy, launcher control)
RESERVED = ("/proc", "/sys", "/dev", "/etc", "/run", "/workspace", "/usr", "/bin", "/lib",
            "/lib64", "/sbin")
MIN_DEPTH = 2  # `/srv` alone would be a whole host tree: a bound root is at least /a/b


def bound_root(op: ProcExecOp) -> bool:
    """Whether ``op`` runs bound: its cwd lies outside the container's ``/workspace``."""
    if op.cwd is None or not op.cwd.startswith("/"):
        return False
    return not is_beneath(CONTAINER_ROOT, posixpath.normpath(op.cwd))


def _overlaps(a: str, b: str) -> bool:
    return is_beneath(a, b) or is_beneath(b, a)


def root_refusal(root: str, system_binds: Iterable[str], workspace_root: str,
                 read_only: bool = False) -> str | None:
    """Why the host path ``root`` may not be bound into a container, or ``None`` (a file
    only read-only)."""
    if root == "/" or len([p for p in root.split("/") if p]) < MIN_DEPTH:
        return f"{quote(root)} is too wide to bind into a container (at least /a/b)"
    clash = next((p for p in (*RESERVED, *system_binds, workspace_root)
                  if _overlaps(posixpath.normpath(p), root)), None)
    if clash is not None:
        return (f"{quote(root)} overlaps {quote(clash)}, which the container or the docker "
                "workspace needs for itself")
    if os.path.realpath(root) != root or not (
            os.path.isdir(root) or read_only and os.path.isfile(root)):
        return f"{quote(root)} is not a plain directory (symlink on the way?)"
    return None


def binds_of(profile: Profile) -> tuple[tuple[str, bool], ...]:
    """``(host path, read-only)`` of a bound call: what bubblewrap would bind."""
    readable, writable = bound_paths(profile)
    return (*((p, False) for p in writable), *((p, True) for p in readable))


def bound_refusal(profile: Profile, op: ProcExecOp, system_binds: Iterable[str],
                  workspace_root: str) -> PolicyEngineError | None:
    """Why a bound call is refused (docker view: the host directory the container gets), or
    ``None``. Judged from the profile, the op, the options and the host's facts of the root
    and the cwd, so the dry run answers the same."""
    for path, read_only in binds_of(profile):
        why = root_refusal(path, system_binds, workspace_root, read_only)
        if why is not None:
            return BackendRefusal(ErrorCode.CAPABILITY_BLOCKED, f"bind {why} (docker view)",
                                  audit={"bind": path})
    return cwd_fact_refusal(profile, op, "docker")


def bound_note(profile: Profile, op: ProcExecOp) -> str:
    """The dry run's words for a bound call."""
    shown = ", ".join(f"{quote(p)} ({'ro' if ro else 'rw'})" for p, ro in binds_of(profile))
    return (f"bound at their own paths: {shown or 'nothing'}; cwd "
            f"{quote(posixpath.normpath(str(op.cwd)))} exists in them (docker view: the host "
            "directories are the container's)")
