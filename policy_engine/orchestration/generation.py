"""A change counter shared by every process on one machine: 8 bytes of a small file."""

from __future__ import annotations

import contextlib
import os
import secrets
import struct
from pathlib import Path

_COUNTER = struct.Struct("<Q")


def file_identity(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``path``, ``None`` when there is none: whether a file
    kept open is still the one the path names."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class Generation:
    """``path`` kept open: a writer ``bump``s it after each change it committed, a reader
    compares ``value`` with the one it last acted on — one ``pread``, no lock.

    Exactness rests on order: the change is committed before the bump, and the bump is done
    before the writer returns; whoever reads a value after that sees the change. Two writers
    bumping at once may both store the same value, which still differs from what any reader
    saw before either change (each committed before reading the counter it bumped).

    Read with ``pread``, not through a shared mapping: a mapping faults (``SIGBUS``, the whole
    engine) once someone truncates the file (outsider attack 36); a short read is "unknown".

    A counter with no value yet (a new file, or one cut short) is started at a random value by
    whoever opens or bumps it first: a reader finding no value trusts nothing it kept and asks
    every time, which on a new install, where nobody ever revoked, was every call. Random, not
    0: a counter cut short and started again must not come back to a value some reader acted
    on before a change (two starters at once just store two such values).

    :raises OSError: the file cannot be created or opened.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        st = os.fstat(self._fd)
        self.identity = (st.st_dev, st.st_ino)
        if st.st_size < _COUNTER.size:
            # a spurious change costs each reader one re-read, nothing else; unwritable, the
            # readers ask every time, as without a counter
            with contextlib.suppress(OSError):
                self.bump()

    def value(self) -> int | None:
        """The counter, or ``None`` when the file holds less than a counter (truncated, or
        never bumped) or cannot be read: the caller must not trust what it kept."""
        try:
            data = os.pread(self._fd, _COUNTER.size, 0)
        except OSError:
            return None
        if len(data) < _COUNTER.size:
            return None
        # a torn read (two halves of a concurrent bump) is just another value: the reader
        # looks again, it never skips a change
        return int(_COUNTER.unpack(data)[0])

    def bump(self) -> None:
        """:raises OSError: the counter cannot be written."""
        now = self.value()
        new = secrets.randbits(63) if now is None else (now + 1) & 0xFFFF_FFFF_FFFF_FFFF
        written = os.pwrite(self._fd, _COUNTER.pack(new), 0)
        if written != _COUNTER.size:
            raise OSError(f"short write to `{self.path}`")

    def replaced(self) -> bool:
        """Whether ``path`` is no longer the open file (removed, or made anew): a bump there
        would not reach this reader."""
        return file_identity(self.path) != self.identity

    def close(self) -> None:
        os.close(self._fd)
