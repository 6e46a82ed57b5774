"""Which identity writes a call's files: the owner of the tree it writes, never a ``chown``.

An engine running as root runs its proc sandboxes as an unprivileged uid. When every writable
bind of a call belongs to one non-root user (a developer's checkout run through ``sudo``, a CI
workspace), the sandbox runs as that user: bwrap maps the uid to 0 of its user namespace, so
the tool looks like root inside and every file it writes is the owner's on the host; nothing of
the tree changes owner (issue 26: a first run used to hand the whole repository to uid 65533,
after which host git refused it as "dubious ownership"). The set-uid/set-gid protections are
the same as for ``run_as`` (seccomp refuses those modes; ``nosuid`` binds).

A tree owned by root (or by several users) runs as ``run_as`` as before; what root owns there is
handed to ``run_as`` (``uid.adopt``) and the call records how many entries changed owner
(:func:`handed_over`, in the result's ``degraded``): never a silent ``chown``. An id-mapped bind
(``MOUNT_ATTR_IDMAP``) would avoid it, but it maps every root inode of the tree, hard links to
host files included (which the hand-over leaves to root): not built until those are masked.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable


def tree_owner(writable: Iterable[str]) -> tuple[int, int] | None:
    """``(uid, gid)`` of the one non-root owner of every writable bind, else ``None`` (no
    writable bind, a root-owned one, several owners, or one that cannot be read)."""
    owners: set[tuple[int, int]] = set()
    for path in writable:
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
            return None
        owners.add((st.st_uid, st.st_gid))
    if len(owners) != 1:
        return None
    (uid, gid), = owners
    return (uid, gid) if uid != 0 and gid != 0 else None


def handed_over(count: int, run_as: tuple[int, int]) -> str:
    """What a call records when it handed ``count`` root-owned entries to ``run_as``."""
    return (f"{count} root-owned entries of the writable paths were handed to uid {run_as[0]} "
            "(chown) so the unprivileged sandbox can write them; keep agent workspaces owned "
            "by an unprivileged user to have them written as that user instead "
            "(docs/operations.md, \"Who writes your files\")")
