"""Which stored directories changed since they were listed: one ``lstat`` each, watched first.

The stored mask walk (``listing_store``) is reused only after this check: a directory whose
``(st_dev, st_ino, st_ctime_ns)`` differs from the stamp it was listed under (a name added,
removed or renamed moves the ctime, which no process can set back; a directory replaced by a
file has another inode) or that is gone is reported changed and listed again. With an inotify
descriptor, each directory is watched *before* its ``lstat`` (watch.py's INVARIANT): a change
after the check is an event, one before it a changed stamp. The loop is the C extension
``_revalidate`` where it is built (setup.py; ≈ 1 µs a directory, two threads), else the same
loop here.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence

STAMP = struct.Struct("=QQQ")  # st_dev, st_ino, st_ctime_ns; (0, 0, 0): never trusted
UNTRUSTED = (0, 0, 0)

try:
    from policy_engine.sandbox import _revalidate
except ImportError:  # not built (no compiler at install): the Python loop answers alike
    _revalidate = None  # type: ignore[assignment]

NATIVE = _revalidate is not None


def pack_paths(paths: Sequence[str]) -> bytes:
    """The directories as the C loop takes them: each followed by a NUL."""
    return b"".join(os.fsencode(p) + b"\0" for p in paths)


def changed(paths: bytes, stamps: bytes, inotify_fd: int = -1, mask: int = 0,
            native: bool = NATIVE) -> tuple[list[int], list[int]]:
    """(indexes of the directories changed since their stamp, each directory's watch
    descriptor or ``-errno``, 0 when not watching); ``paths`` from ``pack_paths``, ``stamps``
    ``STAMP`` records in the same order.

    :raises ValueError: the two do not have the same number of directories.
    """
    if native and _revalidate is not None:
        idx, raw = _revalidate.changed(paths, stamps, inotify_fd, mask)
        return idx, list(memoryview(raw).cast("i"))
    names = paths.split(b"\0")[:-1] if paths else []
    if len(stamps) != STAMP.size * len(names):
        raise ValueError("paths and stamps do not match")
    add = None
    if inotify_fd >= 0:
        add = ctypes.CDLL(None, use_errno=True).inotify_add_watch
        add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    out: list[int] = []
    wds = [0] * len(names)
    for i, (name, want) in enumerate(zip(names, STAMP.iter_unpack(stamps), strict=True)):
        if add is not None:
            wd = add(inotify_fd, name, mask)
            wds[i] = wd if wd >= 0 else -ctypes.get_errno()
        try:
            st = os.lstat(name)
        except OSError:
            out.append(i)
            continue
        if want[1] == 0 or want != (st.st_dev, st.st_ino, st.st_ctime_ns):
            out.append(i)
    return out, wds
