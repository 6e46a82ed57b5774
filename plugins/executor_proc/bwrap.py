"""bubblewrap argv from a sandbox plan, and the startup probe that says whether bwrap runs here."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from plugins.executor_proc import uid
from plugins.executor_proc.spec import Plan, root_view
from plugins.executor_proc.synthetic_etc import synthetic_etc
from policy_engine.guard.binds import beneath
from policy_engine.sandbox.masks import RUNTIME_DIRS

NetworkHook = Callable[[Plan], list[str]]
"""Extension point for network modes beyond off/on: given the plan, return extra bwrap args
(e.g. ``--bind /run/pe-proxy.sock /run/proxy.sock`` plus ``--setenv HTTPS_PROXY …`` for the
"restricted" mode's host-side proxy). The namespace itself stays unshared."""

LAUNCHER_DIR = "/run/policy-engine/launcher"
NATIVE_PATH = "/run/policy-engine/sb_launch"


@dataclass(frozen=True, slots=True)
class BwrapProbe:
    """Result of running a trivial sandbox once at startup."""

    path: str | None
    ok: bool
    reason: str


# the binaries (path, identity and modification time) and uids a trial sandbox ran with in
# this process: an executor made again (every Orchestrator builds its own: a test, a tenant's
# engine) skips the ~80 ms trial. Only a success is kept, for the same binary file; a later
# failure (user namespaces switched off since) is the call's error, as it was between probes.
_PASSED: set[tuple[object, ...]] = set()


def binary_key(path: str, *extra: object) -> tuple[object, ...] | None:
    """``path``'s identity (device, inode, size, mtime) with ``extra``; ``None`` if unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, *extra)


def probe(timeout: float = 10.0, run_as: tuple[int, int] | None = None,
          configured: str | None = None) -> BwrapProbe:
    """Run ``bwrap --unshare-all … true``: installed is not enough (user namespaces, seccomp and
    container runtimes can all forbid it). With ``run_as``, as that uid, as every call will:
    unprivileged user namespaces must work for it. ``configured``: the proc option ``bwrap``
    (an absolute path) instead of ``bwrap`` on PATH. A success is kept for the process
    (``_PASSED``).
    """
    if configured is None:
        path = shutil.which("bwrap")
    else:
        path = configured if os.path.isfile(configured) and os.access(configured, os.X_OK) \
            else None
    if path is None:
        where = f" at `{configured}` (proc option `bwrap`)" if configured else ""
        return BwrapProbe(None, False, f"bwrap is not installed{where} "
                          "(Debian package `bubblewrap`)")
    path = os.path.realpath(path)  # the sandbox uid execs it: no link in a closed directory
    key = binary_key(path, run_as)
    if key is not None and key in _PASSED:
        return BwrapProbe(path, True, "ok")
    try:
        res = subprocess.run(
            [path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--new-session",
             "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev",
             *(["--unshare-user", "--uid", "0", "--gid", "0"] if run_as else []), "true"],
            capture_output=True, timeout=timeout, env={}, check=False, cwd="/",
            user=run_as[0] if run_as else None, group=run_as[1] if run_as else None,
            extra_groups=[] if run_as else None)
    except (OSError, subprocess.TimeoutExpired) as err:
        return BwrapProbe(path, False, f"bwrap probe failed: {err}")
    if res.returncode != 0:
        as_uid = f" as uid {run_as[0]} (proc option `run_as`)" if run_as else ""
        return BwrapProbe(path, False, f"bwrap cannot create a sandbox here{as_uid}: "
                          + res.stderr.decode(errors="replace").strip()[:200]
                          + ("; unprivileged user namespaces must be allowed "
                             "(sysctl user.max_user_namespaces > 0)" if run_as else ""))
    if key is not None:
        _PASSED.add(key)
    return BwrapProbe(path, True, "ok")


def _system_args(paths: list[str], root_bound: bool = False,
                 source: Callable[[str], str] = str) -> list[str]:
    """Merged-/usr systems have /bin → usr/bin: recreate the symlink rather than bind twice
    (a bound ``/`` already holds it)."""
    args: list[str] = []
    root = root_view()  # the plan's own view of `/` (``spec.system_trees``), kept while / holds
    for p in paths:
        target = root.entry(p)[1] if p.count("/") == 1 else None
        if target is not None:
            args += [] if root_bound else ["--symlink", target, p]
        else:
            args += ["--ro-bind", source(p), p]
    return args


_SIZES: dict[str, bool] = {}


def sizes_tmpfs(bwrap: str) -> bool:
    """Whether this bwrap has ``--size`` (0.7 and later): asked once per binary; an older
    one keeps its tmpfs mounts unsized (bounded by the memory cgroup only)."""
    if bwrap not in _SIZES:
        try:
            done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10,
                                  check=False)
            _SIZES[bwrap] = "--size" in done.stdout + done.stderr
        except (OSError, subprocess.SubprocessError):
            _SIZES[bwrap] = False
    return _SIZES[bwrap]


def build_argv(bwrap: str, plan: Plan, *, inner: list[str], launcher_src: str | None,
               network_hook: NetworkHook | None = None,
               native_launcher: str | None = None, run_as: tuple[int, int] | None = None,
               source: Callable[[str], str] = str) -> list[str]:
    """The full bwrap command; ``inner`` runs inside (the launcher or the tool itself).

    Order matters: bwrap applies mounts in argv order. A bind of ``/`` itself (``root_fs "/"``
    with a ``/**`` rule) goes first, so the private /proc, /dev and /tmp cover the host's; then
    the system trees, the profile's read-only and writable binds from shallow to deep (a
    writable ``/w/out`` inside a read-only ``/w``), then the masks so nothing can re-expose a
    secret, then the launcher (its mount point lies under /run, which a mask may have replaced).
    Host runtime directories (/run…) are masked by a writable empty tmpfs: private to this
    sandbox, and the launcher and the network hook need mount points in it.
    """
    args = [bwrap, "--unshare-all", "--unshare-pid", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--hostname", "sandbox", "--clearenv"]
    if run_as is not None:  # uid 0 inside, not nested: the uid_map a tool reads names the host uid
        args += ["--unshare-user", "--uid", "0", "--gid", "0"]
    if plan.network == "on":
        args.append("--share-net")
    for key, value in sorted(plan.env.items()):
        args += ["--setenv", key, value]
    binds = [(p, "--ro-bind") for p in plan.readable] + [(p, "--bind") for p in plan.writable]
    for path, flag in binds:
        if path == "/":
            args += [flag, "/", "/"]
    if run_as is not None and any(p == "/" for p, _ in binds):
        inner_binds = [*plan.system, *(p for p, _ in binds if p != "/")]
        closed = {c for p in inner_binds if (c := uid.closed_ancestor(p, *run_as)) is not None}
        for c in sorted(closed):
            if not any(q != c and beneath(c, q) for q in closed):
                args += ["--tmpfs", c]
    args += _system_args(plan.system, root_bound=any(p == "/" for p, _ in binds), source=source)
    # the writable tmpfs mounts are page cache the write watchdog does not see: each is sized
    # to the call's disk write quota (writewatch.py), and charged to its memory cgroup
    size = (["--size", str(plan.limits.disk_write)]
            if plan.limits is not None and sizes_tmpfs(bwrap) else [])
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp"]
    for path, flag in sorted(binds, key=lambda b: (b[0].count("/"), b[0])):
        if path != "/":
            args += [flag, source(path), path]
    for path in plan.readonly:  # write-forbidden inside a writable bind
        args += ["--ro-bind", source(path), path]
    fake = synthetic_etc()
    for path in plan.mask_files:
        args += ["--ro-bind", source(fake.get(path, "/dev/null")), path]
    for path in plan.mask_dirs:
        args += [*size, "--tmpfs", path] if path in RUNTIME_DIRS else [
            "--tmpfs", path, "--remount-ro", path]
    if launcher_src is not None:
        args += ["--ro-bind", source(launcher_src), LAUNCHER_DIR]
    if native_launcher is not None:
        args += ["--ro-bind", source(native_launcher), NATIVE_PATH]
    if network_hook is not None:
        args += network_hook(plan)
    args += ["--chdir", plan.cwd, "--", *inner]
    return args


def visible(plan: Plan, path: str) -> bool:
    """Whether ``path`` exists inside the sandbox the plan describes (for cwd checks)."""
    return any(beneath(path, b) for b in (*plan.system, *plan.readable, *plan.writable, "/tmp"))
