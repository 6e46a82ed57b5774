"""After a sandbox ran without the seccomp layer: no setuid/setgid file, no device node left behind.

The seccomp filter (``seccomp.py``) refuses setting those bits and making device nodes. Without
it (bwrap with ``layer2: false``) the tool runs as the engine's uid, root included, so this walk
over the writable binds strips the bits and removes device nodes once the sandbox is gone, before
anyone on the host could run them. It never follows a symlink and changes a file only through
a descriptor opened on it with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

_SUID_GID = stat.S_ISUID | stat.S_ISGID


def sanitize(roots: Iterable[str]) -> list[str]:
    """Fix every entry beneath ``roots``; returns the paths changed or removed."""
    fixed: list[str] = []
    stack = list(roots)
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(e.path)
                if st.st_mode & stat.S_ISUID:
                    _strip(e.path, st.st_mode, fixed)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                try:
                    os.unlink(e.path)
                    fixed.append(e.path)
                except OSError:
                    continue
            elif stat.S_ISREG(st.st_mode) and st.st_mode & _SUID_GID:
                _strip(e.path, st.st_mode, fixed)
    return fixed


def _strip(path: str, mode: int, fixed: list[str]) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if stat.S_IFMT(os.fstat(fd).st_mode) == stat.S_IFMT(mode):
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(mode) & ~_SUID_GID)
            fixed.append(path)
    except OSError:
        return
    finally:
        os.close(fd)
