"""Open and read input files within a byte limit, refusing devices and pipes before they block.

A size check on ``st_size`` is not enough: `/dev/zero` and a named pipe report 0 bytes and then
never end (or never start: opening a FIFO without a writer blocks). Every file an engine command
reads as input goes through here: the path is checked with ``stat`` before it is opened, opened
with ``O_NONBLOCK`` (a FIFO swapped in between cannot block the open) and checked again with
``fstat`` on the descriptor actually read.
"""

from __future__ import annotations

import os
import stat


class NotRegularFile(OSError):
    """The path names a directory, device, pipe or socket; ``kind`` says which."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"it is {kind}, not a regular file")
        self.filename = path
        self.kind = kind

    def __str__(self) -> str:
        return f"it is {self.kind}, not a regular file"


def describe(mode: int) -> str:
    """What a non-regular file is, in words (``a named pipe (FIFO)``)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (symlinks followed) is a regular file; never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: str | os.PathLike[str]) -> int:
    """A blocking, read-only descriptor on the regular file ``path``.

    :raises NotRegularFile: ``path`` is a directory, device, pipe or socket.
    :raises OSError: it cannot be opened. ``ValueError``: a NUL byte in the path.
    """
    shown = os.fspath(path)
    before = os.stat(path).st_mode
    if not stat.S_ISREG(before):
        raise NotRegularFile(str(shown), describe(before))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise NotRegularFile(str(shown), describe(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_limited(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (more than ``limit`` bytes
    returned means the file is over the limit).

    :raises NotRegularFile, OSError, ValueError: as :func:`open_regular`.
    """
    fd = open_regular(path)
    chunks: list[bytes] = []
    total = 0
    try:
        while total <= limit:
            chunk = os.read(fd, min(limit + 1 - total, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
