"""A change counter shared by every process on one machine: 8 bytes of a mapped file."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

_COUNTER = struct.Struct("<Q")


class Generation:
    """``path`` mapped shared: a writer ``bump``s it after each change it committed, a reader
    compares ``value`` with the one it last acted on — a memory read, no system call.

    Exactness rests on order: the change is committed before the bump, and the bump is done
    before the writer returns; whoever reads a value after that sees the change. Two writers
    bumping at once may both store the same value, which still differs from what any reader
    saw before either change (each committed before reading the counter it bumped).

    :raises OSError: the file cannot be created, sized or mapped.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            st = os.fstat(fd)
            if st.st_size < _COUNTER.size:
                os.ftruncate(fd, _COUNTER.size)  # a fresh file: the counter starts at 0
            self._map = mmap.mmap(fd, _COUNTER.size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.identity = (st.st_dev, st.st_ino)

    def value(self) -> int:
        # a torn read (two halves of a concurrent bump) is just another value: the reader
        # looks again, it never skips a change
        return int(_COUNTER.unpack_from(self._map)[0])

    def bump(self) -> None:
        _COUNTER.pack_into(self._map, 0, (self.value() + 1) & 0xFFFF_FFFF_FFFF_FFFF)

    def replaced(self) -> bool:
        """Whether ``path`` is no longer the mapped file (removed, or made anew): a bump there
        would not reach this mapping."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.identity

    def close(self) -> None:
        self._map.close()
