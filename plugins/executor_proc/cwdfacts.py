"""The ``cwd`` of a process, judged in the view of the proc executor that would run it.

The guard decides the policy and that a ``cwd`` lies beneath ``root_fs``; whether the directory
exists is a fact of the executor's own view (issue 26): the bind view of bubblewrap (host paths
bound at their own place, so: it exists on the host, beneath a bound path), the host itself for
proc-landlock, proc-unshare and ``local``. ``refusal`` asks this, so the backend selection of a
run and of its dry run (``explain --config``) give the same answer, which names the view.
"""

from __future__ import annotations

import errno
import os
import stat

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.binds import cwd_refusal
from policy_engine.guard.paths import normalize_path, quote, resolve_beneath
from policy_engine.model import ExecOp, ProcExecOp, Profile

VIEWS = {"proc-bwrap": "bwrap view", "proc-landlock": "landlock view",
         "proc-unshare": "unshare view", "local": "host view"}
"""How each proc executor's refusals name its view (landlock and unshare see host paths)."""


def view_of(executor_name: str) -> str:
    """How a refusal names the view of ``executor_name``."""
    return VIEWS.get(executor_name, f"{executor_name} view")


def cwd_fact_refusal(profile: Profile, op: ExecOp, executor_name: str
                     ) -> PolicyEngineError | None:
    """Why ``executor_name`` refuses ``op.cwd`` in its view, or ``None`` (no cwd, or a
    directory the process can enter). A cwd whose facts cannot be read is refused."""
    if not isinstance(op, ProcExecOp) or op.cwd is None:
        return None
    view = view_of(executor_name)
    try:
        cwd = normalize_path(op.cwd)
    except PolicyEngineError as exc:
        return exc
    why = cwd_refusal(profile, cwd)
    if why is not None:
        return PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, f"{why} ({view})")
    root = profile.mappings.root_fs.rstrip("/") or "/"
    try:
        real = resolve_beneath(root, cwd)
        st = os.stat(real)
    except PolicyEngineError as exc:
        return PolicyEngineError(exc.code, f"{exc.reason} ({view})")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                     f"cwd {quote(cwd)} does not exist ({view})")
        return PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                 f"the facts of cwd {quote(cwd)} cannot be read "
                                 f"({os.strerror(exc.errno or errno.EIO)}; {view}): refused")
    if not stat.S_ISDIR(st.st_mode):
        return PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                 f"cwd {quote(cwd)} is not a directory ({view})")
    return None


def cwd_fact_note(profile: Profile, op: ExecOp, executor_name: str) -> str | None:
    """The trace's words for a cwd this view accepts (``None`` without a cwd)."""
    if not isinstance(op, ProcExecOp) or op.cwd is None:
        return None
    return f"cwd {quote(normalize_path(op.cwd))} exists ({view_of(executor_name)})"
