"""Space held back on the evidence log's file system so a begun call's end record still fits
when the disk fills up."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

RESERVE_BYTES = 64 * 1024  # dozens of end records; freed only when a write hits a full disk
FULL = (errno.ENOSPC, errno.EDQUOT)


class SpaceReserve:
    """A preallocated file beside the log: given back to the file system when a record does
    not fit, taken again once there is room (at the next record written).

    Without it a full disk splits a call's begin from its end: the begin fitted in the log's
    last page, the end did not, and the spool on the same disk cannot take it either.
    """

    def __init__(self, log_path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = log_path.with_name(f".{log_path.name}.reserve")
        self.size = size

    def hold(self) -> bool:
        """Make sure the reserve exists and is allocated; False when the disk has no room."""
        try:
            if self.path.exists() and self.path.stat().st_blocks * 512 >= self.size:
                return True
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
            return True
        except OSError as exc:
            if exc.errno not in FULL:
                log.warning("evidence reserve `%s` cannot be allocated: %s", self.path,
                            exc.strerror or exc)
            self.path.unlink(missing_ok=True)  # a partial reserve only wastes space
            return False

    def give_back(self) -> bool:
        """Free the reserve (a write just found the disk full); True when there was one."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.error("evidence log `%s`: the disk is full; its %d-byte reserve was released so "
                  "the record fits; free space on this file system", self.path.parent,
                  self.size)
        return True
