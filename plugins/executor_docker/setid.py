"""After a run: no set-id bit and no device node the container wrote survives in a host bind.

The container's uid (1000) can be a real host account. The seccomp profile refuses every way to
create a set-id file or a device node it knows (``seccomp_profile.py``) and the project directory
is ``0700`` (no other host user can reach ``work/``); this sweep is the third line, for a syscall
a future kernel adds. It walks with directory descriptors and never follows a symlink: the
container (or a concurrent one of the same project) may have planted them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SETID = stat.S_ISUID | stat.S_ISGID


def sweep(top: Path) -> list[str]:
    """Clear set-id bits beneath ``top`` and remove device nodes; the paths touched."""
    try:
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    touched: list[str] = []
    try:
        _sweep_dir(fd, "", touched)
    finally:
        os.close(fd)
    return touched


def _sweep_dir(dir_fd: int, prefix: str, touched: list[str]) -> None:
    for name in os.listdir(dir_fd):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed meanwhile
        rel = prefix + name
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
            touched.append(rel)
            continue
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) and st.st_mode & SETID):
            continue  # symlinks carry no mode of their own; fifos and sockets run nothing
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        if stat.S_ISDIR(st.st_mode):
            flags |= os.O_DIRECTORY
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError:
            continue  # swapped for a symlink or removed meanwhile: nothing of ours to fix
        try:
            now = os.fstat(fd)
            if now.st_mode & SETID:
                os.fchmod(fd, stat.S_IMODE(now.st_mode) & ~SETID)
                touched.append(rel)
            if stat.S_ISDIR(now.st_mode):
                _sweep_dir(fd, rel + "/", touched)
        finally:
            os.close(fd)
