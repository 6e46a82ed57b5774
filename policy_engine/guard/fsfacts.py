"""Step 8b for fs ops: what the fs executor will find at the resolved path, decided beforehand.

The fs executor refuses, with ``SANDBOX.CAPABILITY_BLOCKED``, a read of anything but a regular
file, a whole-file read larger than ``bytes_in``, and a write over a non-regular file or over an
existing one without ``overwrite``. Those are facts of the file system a dry run can see as well
as the run, so the guard refuses them with the same code (docs/cli.md, "Dry run equals run").
One ``lstat`` of the already resolved path answers them; a path that does not exist yet is left
to the run, one whose facts cannot be read (permission, a race) is refused with its own reason.
``seen`` may come from a declared or unknown fact source instead (``facts.py``). What changes
after the decision (a file grown, a link swapped in) the executor still catches on the
descriptor it opens.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from policy_engine.guard.nofollow import Stat
from policy_engine.guard.paths import quote
from policy_engine.model import SYSTEM_DEFAULT_LIMITS

Found = tuple[str, str]
"""The limit field involved (``""`` when none is) and the public reason."""


def fs_refusal(kind: str, op: Any, path: str, max_bytes_in: int | None,
               seen: Stat | str | None = None) -> Found | None:
    """Why the fs executor would refuse ``op`` on resolved ``path``, or ``None``.

    :param max_bytes_in: the effective ``bytes_in`` (the built-in default when unset), which a
        read without ``len`` must fit.
    :param seen: what resolving the path saw (``resolve.resolve_fs``): its mode and size as
        ``lstat`` says them (``nofollow.Stat``), ``"absent"``, or ``None`` to ``lstat`` it here.
    """
    if kind == "fs.list":
        return None  # a missing or non-directory path fails at run (not a policy refusal)
    if type(seen) is tuple:
        mode, size = seen
    elif seen is not None:
        return None  # absent (yet): the executor's open answers it
    else:
        try:
            st = os.lstat(path)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None  # absent (yet): the executor's open answers it
            # unreadable (permission, a race): a deny of its own, never decided as an allow
            return "", (f"the facts of {quote(path)} cannot be read "
                        f"({os.strerror(exc.errno or errno.EIO)}): refused")
        mode, size = st.st_mode, st.st_size
    if stat.S_ISLNK(mode):
        return None  # swapped in since the resolution: the executor's no-follow open refuses it
    if kind == "fs.read":
        if not stat.S_ISREG(mode):
            return "", f"{quote(path)} is not a regular file"
        cap = max_bytes_in if max_bytes_in is not None else SYSTEM_DEFAULT_LIMITS.max_bytes_in
        if op.len is None and cap is not None and size > cap:
            return "max_bytes_in", f"{quote(path)} is larger than max_bytes_in {cap}"
        return None
    if not stat.S_ISREG(mode):
        return "", f"{quote(path)} exists and is not a regular file"
    if not op.overwrite:
        return "", f"{quote(path)} exists and overwrite is false"
    return None
