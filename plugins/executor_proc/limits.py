"""Resource limits applied in the child between fork and exec: cgroup attach and rlimits.

Which mechanism holds which limit is reported in ``out["limits"]``:
pids — the per-exec pids cgroup when one can be made, else RLIMIT_NPROC (per user, and ignored
for root, so the report says ``unenforced``); memory — the memory cgroup, else RLIMIT_AS;
cpu — RLIMIT_CPU always (CPU seconds = timeout × cores, a backstop) plus the cpu cgroup quota;
disk — RLIMIT_FSIZE (the proc option ``max_file_bytes``): no file written grows past it; the
call's total, ``disk_write_bytes``, by the write watchdog (writewatch.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import os
import resource
import stat
from collections.abc import Callable

from plugins.executor_proc.cgroups import ExecCgroup
from plugins.executor_proc.spec import Limits
from plugins.executor_proc.uid import STAGE_DIR, Reach
from policy_engine.guard.nofollow import open_no_symlinks


def describe(limits: Limits, cg: ExecCgroup | None) -> dict[str, str]:
    """Which mechanism enforces each limit for this exec."""
    ctrls = cg.controllers if cg else []
    return {
        "pids": f"cgroup-{cg.version} pids.max={limits.pids}" if cg and "pids" in ctrls else (
            "unenforced (RLIMIT_NPROC does not bind root)" if os.geteuid() == 0
            else f"RLIMIT_NPROC={limits.pids} (per user)"),
        "memory": (f"cgroup memory={limits.memory_bytes}" if "memory" in ctrls
                   else f"RLIMIT_AS={limits.memory_bytes}"),
        "cpu": f"RLIMIT_CPU={cpu_seconds(limits)}s"
               + (f" + cgroup quota {limits.cpu_cores} cores" if "cpu" in ctrls else ""),
        "wall": f"{limits.timeout_s}s, process group killed",
        "disk": f"{limits.disk_write} bytes written by the call, write watchdog (writewatch.py)",
    }


def cpu_seconds(limits: Limits) -> int:
    return max(1, math.ceil(limits.timeout_s * limits.cpu_cores) + 1)


def preexec(limits: Limits, cg: ExecCgroup | None, max_file_bytes: int | None = None,
            reach: Reach | None = None,
            run_as: tuple[int, int] | None = None) -> Callable[[], None]:
    """The function Popen runs in the child. Only async-signal-tolerant work: raw os calls, no
    imports, no locks (the parent may have other threads). Last, what the native launcher's
    ``-o``/``-m``/``-b``/``-u`` do: in a private mount namespace stage bind sources, cover closed
    directories, bind staged paths back; then become ``run_as``.
    """
    # loaded here, not in the child
    libc = ctypes.CDLL(None, use_errno=True) if reach is not None and (
        reach.staged or reach.new_ipc or reach.hides) else None
    procs = cg.procs_files if cg else []
    ctrls = cg.controllers if cg else []
    cpu = cpu_seconds(limits)
    mem = limits.memory_bytes
    nproc = limits.pids

    def _apply() -> None:
        pid = str(os.getpid()).encode()
        for path in procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
        if "memory" not in ctrls:
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        if "pids" not in ctrls:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if libc is not None and reach is not None:
            _stage(libc, reach)
        if run_as is not None:
            os.setgroups([])
            os.setresgid(run_as[1], run_as[1], run_as[1])
            os.setresuid(run_as[0], run_as[0], run_as[0])

    return _apply


_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18
_MS_NOSUID, _MS_NODEV, _MNT_DETACH, _CLONE_NEWIPC = 2, 4, 2, 0x08000000
_MS_RDONLY = 1


def _stage(libc: ctypes.CDLL, reach: Reach) -> None:
    """``sb_launch.c``'s ``-I`` and ``stage()``: a fresh IPC namespace; each source bound at
    STAGE_DIR/N in a private mount namespace, where bwrap (no longer root) can look it up;
    covers and binds back after."""

    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), what)

    if reach.new_ipc:
        ok(libc.unshare(_CLONE_NEWIPC), "unshare(CLONE_NEWIPC) failed")
    if not reach.staged and not reach.hides:
        return

    ok(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS) failed")
    ok(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "cannot make mounts private")
    if reach.staged:
        with contextlib.suppress(FileExistsError):
            os.mkdir(STAGE_DIR, 0o755)
        ok(libc.mount(b"pe-stage", STAGE_DIR.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      b"mode=0755,size=64k"), "cannot mount the staging tmpfs")
    for i, path in reach.staged:
        # through a descriptor with no symlink on the path (sb_launch.c's stage, round 6 F01)
        where = f"{STAGE_DIR}/{i}"
        sfd = open_no_symlinks(path)
        try:
            if stat.S_ISDIR(os.fstat(sfd).st_mode):
                os.mkdir(where, 0o755)
            else:
                os.close(os.open(where, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            ok(libc.mount(f"/proc/self/fd/{sfd}".encode(), os.fsencode(where), None,
                          _MS_BIND | _MS_REC, None), f"cannot stage {path}")
        finally:
            os.close(sfd)
    for cover in reach.covers:
        ok(libc.mount(b"pe-cover", os.fsencode(cover), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      b"mode=0755,size=64k"), f"cannot cover {cover}")
    for i, dest in reach.rebinds:
        where = f"{STAGE_DIR}/{i}"
        if stat.S_ISDIR(os.stat(where).st_mode):
            os.makedirs(dest, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dest), 0o755, exist_ok=True)
            os.close(os.open(dest, os.O_CREAT | os.O_WRONLY, 0o644))
        ok(libc.mount(os.fsencode(where), os.fsencode(dest), None, _MS_BIND | _MS_REC, None),
           f"cannot bind {dest}")
    if reach.rebinds:
        ok(libc.umount2(STAGE_DIR.encode(), _MNT_DETACH), "cannot detach the stage")
    for hide in reach.hides:  # sb_launch.c -M: a masked dir already gone (or hidden) is skipped
        if libc.mount(b"pe-mask", os.fsencode(hide), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_RDONLY,
                      b"mode=0755,size=4k") != 0 and ctypes.get_errno() not in (
                          errno.ENOENT, errno.ENOTDIR):
            raise OSError(ctypes.get_errno(), f"cannot cover {hide}")
