"""Host runtime directories no sandbox may see, and the segment-wise containment test.

Its own module so the guard (``binds.py``) can ask ``under_runtime`` without importing the mask
planner (``masks.py``, which re-exports these names).
"""

from __future__ import annotations

import os

RUNTIME_DIRS: tuple[str, ...] = ("/run", "/var/run", "/var/lib/docker", "/var/lib/containerd",
                                 "/var/lib/containers", "/var/lib/kubelet")
"""Host control sockets (docker, containerd, dbus, systemd, podman, the user's runtime dir) live
here: never bound into a sandbox, and hidden under an empty read-only tmpfs when a bind contains
them, whatever the policy or ``root_fs`` says."""
NEVER_WALKED = frozenset({"/proc", "/sys", "/dev"})
"""Kernel filesystems: a sandbox gets its own /proc and /dev, and nothing there is a secret file
a glob could name (walking /proc would also never end the same way twice)."""
RUNTIME_GLOBS: tuple[str, ...] = ("/tmp/pe-net-*", "/tmp/pe-proc-*", "/tmp/pe-docker-*",
                                  "/tmp/.X11-unix", "/tmp/.ICE-unix", "/tmp/dbus-*",
                                  "/tmp/tmux-*", "/tmp/ssh-*")
"""Other calls' policy proxies and private dirs, and the usual socket dirs under /tmp."""


def beneath(path: str, root: str) -> bool:
    """Segment-wise containment (``/w`` contains ``/w/x`` but never ``/w-evil``)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def under_runtime(path: str) -> bool:
    """Whether ``path`` (resolved) is a host runtime directory or lies beneath one."""
    real = os.path.realpath(path)
    return any(beneath(p, r) for p in (path, real) for r in RUNTIME_DIRS)
