"""Whether every file system beneath a root is local: no server there can stall a read."""

from __future__ import annotations

import os
import select
import threading

from policy_engine.pid import current as current_pid

# file systems whose reads and lookups end without a server, a daemon or a device driver that
# may never answer (NFS, CIFS, FUSE, 9p, ceph… are not here, nor proc/sys, whose files are
# served by kernel code that can wait on other processes)
LOCAL_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay",
                         "f2fs", "jfs", "reiserfs", "squashfs", "erofs", "vfat", "exfat",
                         "zfs", "bcachefs", "devtmpfs"})
_MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    if "\\" not in field:
        return field
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """``(mount point, file system type)`` of each line of ``/proc/self/mountinfo``."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mounts.append((_unescape(fields[4]), tail.split()[0]))
    return mounts


def all_local(mounts: list[tuple[str, str]], root: str) -> bool:
    """Whether the mount holding ``root`` (a real path) and every mount at or beneath it are
    of a ``LOCAL_TYPES`` file system."""
    beneath = root.rstrip("/") + "/"
    holder: tuple[str, str] | None = None
    for point, fstype in mounts:
        if (point == root or point.startswith(beneath)) and fstype not in LOCAL_TYPES:
            return False
        covers = point == "/" or root == point or root.startswith(point.rstrip("/") + "/")
        if covers and (holder is None or len(point) >= len(holder[0])):
            holder = (point, fstype)  # of equal mount points the later one is on top
    return holder is not None and holder[1] in LOCAL_TYPES


class LocalMounts:
    """``all_local`` over this process's mount table, read again only when it changed (the
    kernel flags ``/proc/self/mountinfo`` with ``POLLPRI`` after every mount or unmount)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0
        self._poll = select.poll()
        self._mounts: list[tuple[str, str]] = []
        self._answers: dict[str, bool] = {}

    def _open(self) -> None:
        # a forked child opens its own: the change flag and the offset belong to the open
        # file, which a parent and its workers would otherwise share
        self._close()
        fd = os.open(_MOUNTINFO, os.O_RDONLY | os.O_CLOEXEC)
        self._fd, self._pid = fd, current_pid()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLPRI | select.POLLERR)
        self._read(fd)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read(self, fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        self._mounts = parse_mountinfo(b"".join(chunks).decode("utf-8", "surrogateescape"))
        self._answers = {}

    def local(self, root: str) -> bool:
        """Whether everything beneath ``root`` is on local file systems; ``False`` when the
        mount table cannot be read."""
        with self._lock:
            try:
                if self._fd is None or self._pid != current_pid():
                    self._open()
                elif self._poll.poll(0):  # the poll itself clears the flag: read after it
                    self._read(self._fd)
            except OSError:
                self._close()  # opened again next time
                return False
            answer = self._answers.get(root)
            if answer is None:
                answer = self._answers[root] = all_local(self._mounts, root)
            return answer
