"""Locking a shared mapped table, refusing one whose file was cut short under it."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path


def lock_whole(fd: int, mode: int, size: int, path: Path) -> None:
    """``flock(fd, mode)``, then check that the file still holds the ``size`` bytes mapped.

    A shared mapping past the end of a truncated file faults (``SIGBUS``) on the next access
    and kills the whole engine (outsider attack 36: `: > budget.meter`, or a `cp` restoring
    it, while `serve` ran). Under the lock the table is only touched by engines, all of which
    take it first, so a file of the right size here stays so for the block unless something
    that ignores the lock cuts it within those microseconds.

    :raises OSError: (the lock released) the file was truncated; the meter answers it as an
        unusable table (``PROVIDER.UNAVAILABLE``) until the engine is restarted, which lays
        the table out again.
    """
    fcntl.flock(fd, mode)
    try:
        short = os.fstat(fd).st_size < size
    except OSError:
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise
    if short:
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise OSError(errno.EIO, f"the shared table `{path}` was truncated while in use "
                      "(restart the engine to lay it out again)")
