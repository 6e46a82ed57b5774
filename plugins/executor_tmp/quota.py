"""Size quotas for temp spaces: a tmpfs mount when permitted, explicit accounting otherwise."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from typing import Final

_MS_NOSUID: Final = 0x2
_MS_NODEV: Final = 0x4
_MS_NOEXEC: Final = 0x8
_MNT_DETACH: Final = 0x2
PAGE: Final = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)


def page_round(size: int) -> int:
    """tmpfs sizes are whole pages, and ``size=0`` would mean unlimited: at least one page."""
    return max(PAGE, -(-size // PAGE) * PAGE)


def mount_tmpfs(path: str, size: int) -> int:
    """Mount a size-limited tmpfs on ``path``; returns 0 or the errno (EPERM when not root)."""
    opts = f"size={page_round(size)},mode=0700".encode()
    rc = _libc.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, opts)
    return 0 if rc == 0 else ctypes.get_errno() or errno.EPERM


def unmount(path: str) -> None:
    """Lazy unmount: a process still inside the space must not keep it from being released."""
    if _libc.umount2(path.encode(), _MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point (already gone)
            raise OSError(e, os.strerror(e), path)


def disk_usage(path: str) -> int:
    """Bytes allocated beneath ``path`` (``st_blocks``, so sparse files cannot cheat), no-follow."""
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except FileNotFoundError:
            continue  # removed while counting
    return total


def remove_tree(path: str) -> None:
    """Delete a temp space without following symlinks planted inside it (fd-relative)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        _clear_dir(fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _clear_dir(dir_fd: int) -> None:
    for name in os.listdir(dir_fd):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dir_fd)
            try:
                _clear_dir(sub)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
