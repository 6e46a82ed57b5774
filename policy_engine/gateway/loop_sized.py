"""Whether a contained read or listing is small enough to run on an event loop at all.

An event loop answers every other request between its calls; a call run on it holds them all.
A read hashes the whole file up to ``max_bytes_in`` (10 MiB by default) and a listing walks
every entry down to its depth, so twelve clients reading 10 MiB files held `/v1/decide` at
327 ms median (outsider attack 36). The op's own fields or one ``lstat`` of its path say how
big it can be; anything bigger or unknown runs on a thread, as before. This is scheduling,
not a decision: the guard decides the call wherever it runs, and a wrong guess (a file that
grows after the ``lstat``) costs one bounded read of the loop's time.
"""

from __future__ import annotations

import os
import stat

from policy_engine.model import ExecOp, FsListOp, FsReadOp

LOOP_READ_BYTES = 256 * 1024
"""A read on the loop reads and hashes at most this much (a few hundred microseconds)."""

LOOP_LIST_DIR_BYTES = 32 * 1024
"""A listing on the loop: one level of a directory of at most this size (≈ 1,000 entries on
ext4, whose directories grow by 4 KiB blocks of about 100 names)."""


def loop_sized(op: ExecOp) -> bool:
    """Whether ``op`` is a read of at most ``LOOP_READ_BYTES`` or a one-level listing of a
    small directory; ``False`` for any other op, and when its path cannot be looked at."""
    if isinstance(op, FsReadOp):
        if op.len is not None and op.len <= LOOP_READ_BYTES:
            return True
        try:
            st = os.lstat(op.path)
        except (OSError, ValueError):
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size - (op.offset or 0) <= LOOP_READ_BYTES
    if isinstance(op, FsListOp):
        if op.depth > 1:
            return False
        try:
            st = os.lstat(op.path)
        except (OSError, ValueError):
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_size <= LOOP_LIST_DIR_BYTES
    return False
