"""One wording for a state store that cannot be used: which store, which file, and why."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from policy_engine.errors import ErrorCode, PolicyEngineError

# A broken budget or revocation store denies the call (fail closed) with this code: the store,
# like an execution backend, is a dependency that is unavailable, and the call may succeed once
# the operator repairs it (retryable, 503).
STORE_UNAVAILABLE = ErrorCode.PROVIDER_UNAVAILABLE


def cause_of(exc: BaseException, path: Path) -> str:
    """The cause in words, with what SQLite leaves unsaid (a read-only file system or
    directory) found out from the file system itself.
    """
    if isinstance(exc, OSError):
        text = exc.strerror or str(exc)
        return f"{text} (`{exc.filename}`)" if exc.filename and str(exc.filename) != str(
            path) else text
    text = str(exc) or type(exc).__name__
    hint = None
    if isinstance(exc, sqlite3.Error) and ("readonly" in text or "unable to open" in text):
        hint = _why_unwritable(path)
    elif isinstance(exc, sqlite3.Error) and ("I/O" in text or "full" in text):
        hint = _why_full(path)
    return f"{text}: {hint}" if hint else text


def _why_full(path: Path) -> str | None:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return None
    if st.f_bavail == 0 or st.f_favail == 0:
        return f"the file system of `{path.parent}` is full"
    return None


def _why_unwritable(path: Path) -> str | None:
    for where in (path, path.parent):
        try:
            if os.statvfs(where).f_flag & os.ST_RDONLY:
                return f"`{where}` is on a read-only file system"
        except OSError:
            continue
    for where in (path, path.parent):
        if where.exists() and not os.access(where, os.W_OK):  # permissions, chattr +i
            return f"`{where}` is not writable"
    if path.parent.exists() and not path.parent.is_dir():
        return f"`{path.parent}` is not a directory"
    if not path.parent.exists():
        return f"directory `{path.parent}` does not exist"
    return None


def store_error(what: str, path: Path, exc: BaseException) -> PolicyEngineError:
    """``PROVIDER.UNAVAILABLE``: ``<what> `<path>` cannot be used: <cause>``."""
    return PolicyEngineError(STORE_UNAVAILABLE, f"{what} `{path}` cannot be used: "
                             f"{cause_of(exc, path)}",
                             audit={"store": what, "path": str(path),
                                    "exception": type(exc).__name__})
