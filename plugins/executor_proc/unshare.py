"""proc-unshare: util-linux `unshare` namespaces around the Landlock + seccomp launcher.

For hosts where bubblewrap is missing or cannot build its sandbox. `unshare` gives the process
fresh mount, UTS, IPC, network and pid namespaces (a private /proc of its own pid namespace,
an empty network namespace when the network is off, pid 1 of its own so nothing outlives it),
but no view of its own: the host's file tree stays where it is, and what the process may touch
is bounded by the same Landlock carving, seccomp filter (no AF_UNIX, no setsid, no set-id
bits) and rlimits/cgroups as proc-landlock. Chosen by configuration only (`backends:
{proc.exec: proc-unshare}`): proc-bwrap never falls back to it by itself.

An engine running as root runs `unshare` as root (no user namespace needed: it works where
unprivileged user namespaces are off, the usual reason bwrap cannot run) and `unshare` drops
to the proc option `run_as` before it starts the launcher; any other engine gets a user
namespace mapping its own uid (``--map-current-user``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from plugins.executor_proc.bwrap import binary_key

NAMESPACES = ("mount", "uts", "ipc", "pid")
"""Always unshared; ``net`` too unless the profile's network is ``on``."""
ENV = os.path.realpath(shutil.which("env") or "/usr/bin/env")


@dataclass(frozen=True, slots=True)
class UnshareProbe:
    """Result of creating the namespaces once at startup."""

    path: str | None
    ok: bool
    reason: str


def locate(configured: str | None) -> str | None:
    """The `unshare` binary: the proc option ``unshare`` when set, else ``unshare`` on PATH."""
    if configured is not None:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) \
            else None
    found = shutil.which("unshare")
    return os.path.realpath(found) if found else None


def namespace_args(unshare: str, *, network_on: bool, run_as: tuple[int, int] | None,
                   cwd: str) -> list[str]:
    """The `unshare` command up to (not including) the program it starts.

    ``--kill-child``: when `unshare` dies (the engine kills the process group at the
    deadline), its child, pid 1 of the namespace, gets SIGKILL and the kernel kills every
    process of the namespace with it. ``--wd``: the working directory is entered after the
    mounts, inside the namespace.
    """
    args = [unshare, "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child",
            "--mount-proc", "--propagation", "private"]
    if not network_on:
        args.append("--net")
    if run_as is not None:  # root: the namespaces need no user namespace; then the drop
        args += ["--setgid", str(run_as[1]), "--setuid", str(run_as[0])]
    else:
        args += ["--user", "--map-current-user"]
    return [*args, "--wd", cwd]


def environment(env: dict[str, str]) -> list[str]:
    """``env -i -- K=V … ``: how the tool's environment crosses `unshare`. `unshare` runs as
    root and is dynamically linked, so it must get an empty environment (an allowed
    ``LD_PRELOAD`` would run as host root); `env`, started after the drop, sets it."""
    return [ENV, "-i", "--", *(f"{k}={v}" for k, v in sorted(env.items()))]


_PASSED: set[tuple[object, ...]] = set()  # as ``bwrap._PASSED``: successes, per binary


def probe(configured: str | None, run_as: tuple[int, int] | None,
          timeout: float = 10.0) -> UnshareProbe:
    """Create every namespace once and start ``true`` in them as the sandbox uid: installed is
    not enough (seccomp, a container runtime or a disabled user namespace can forbid it). A
    success is kept for the process, for the same binaries and uid (``_PASSED``)."""
    path = locate(configured)
    if path is None:
        where = f" at `{configured}` (proc option `unshare`)" if configured else ""
        return UnshareProbe(None, False, f"unshare is not installed{where} "
                            "(Debian package `util-linux`)")
    true = shutil.which("true") or "/bin/true"
    argv = [*namespace_args(path, network_on=False, run_as=run_as, cwd="/"),
            "--", os.path.realpath(true)]
    key = binary_key(path, run_as, binary_key(os.path.realpath(true)))
    if key is not None and key in _PASSED:
        return UnshareProbe(path, True, "ok")
    try:
        res = subprocess.run(argv, capture_output=True, timeout=timeout, env={}, check=False,
                             cwd="/")
    except (OSError, subprocess.TimeoutExpired) as err:
        return UnshareProbe(path, False, f"unshare probe failed: {err}")
    if res.returncode != 0:
        how = (f"as root, dropping to uid {run_as[0]} (proc option `run_as`)" if run_as
               else "in a user namespace (unprivileged user namespaces must be allowed: "
               "sysctl user.max_user_namespaces > 0)")
        return UnshareProbe(path, False, f"unshare cannot create the namespaces {how}: "
                            + res.stderr.decode(errors="replace").strip()[:200])
    if key is not None:
        _PASSED.add(key)
    return UnshareProbe(path, True, "ok")
