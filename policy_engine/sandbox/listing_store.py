"""The mask planner's directory listings kept on disk between runs (issue 27 item 4).

A fresh process's first plan of the system trees listed ~26,000 directories (≈ 0.65–1.3 s);
with the listings of the last run loaded it lists only the directories that changed since,
one ``lstat`` each for the rest. The reuse test is the in-memory one (``masks.DirCache``): a
listing serves only under the same ``(st_dev, st_ino, st_ctime_ns)`` as when it was taken, and
only if it was taken more than ``RACY_NS`` after the directory's last change. Adding, removing
or renaming a name changes the directory's ctime, which no process can set back, so a secret
planted while the engine was stopped is seen by the first plan after the restart: its
directory is listed again (``tests/integration/test_listing_store.py``).

The file is ``marshal`` data, so it is read only from a regular file this user owns in a
directory this user owns and nobody else can write (``$POLICY_ENGINE_STATE/cache``, else
``$XDG_CACHE_HOME/policy-engine`` or ``~/.cache/policy-engine``), and written under a private
name then renamed into place. Any problem means no stored listings: every directory is listed,
as before. ``POLICY_ENGINE_LISTING_CACHE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import gc
import marshal
import os
import stat
import sys
import tempfile
from collections.abc import Sequence

from policy_engine.sandbox.masks import DirCache, Listing, beneath

DISABLE_ENV = "POLICY_ENGINE_LISTING_CACHE"
FORMAT = 1
MAX_FILE_BYTES = 256 << 20  # bounded memory whatever lies in the file


def store_path() -> str | None:
    """The listings file, or ``None`` when turned off."""
    if os.environ.get(DISABLE_ENV, "1") in ("0", "false", "no", "off"):
        return None
    state = os.environ.get("POLICY_ENGINE_STATE")
    if state:
        where = os.path.join(os.path.abspath(os.path.expanduser(state)), "cache")
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        where = os.path.join(os.path.abspath(xdg), "policy-engine")
    return os.path.join(where, f"mask-listings-py{sys.version_info[0]}{sys.version_info[1]}.bin")


def _private(path: str, *, directory: bool) -> bool:
    st = os.lstat(path)
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    return kind_ok and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def load(cache: DirCache, path: str | None = None) -> int:
    """Put the stored listings into ``cache`` (not over a listing it holds); returns how many.
    A missing, foreign, malformed or oversized file loads nothing."""
    path = path or store_path()
    if path is None:
        return 0
    try:
        if not (_private(os.path.dirname(path), directory=True)
                and _private(path, directory=False)):
            return 0
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            return 0
        paused = gc.isenabled()
        gc.disable()  # 26,000 rows of new objects: no collection passes over them meanwhile
        try:
            fmt, rows = marshal.loads(raw)  # our own file, checked private above
            if fmt != FORMAT:
                return 0
            listings = [Listing.from_row(row) for row in rows]
        finally:
            if paused:
                gc.enable()
    except (OSError, ValueError, TypeError, EOFError):
        return 0
    return cache.adopt(listings)


def save(cache: DirCache, roots: Sequence[str], path: str | None = None) -> int:
    """Write ``cache``'s trusted listings beneath ``roots`` (atomically); returns how many."""
    path = path or store_path()
    if path is None:
        return 0
    rows = [listing.to_row(p) for p, listing in cache.trusted_listings()
            if any(beneath(p, r) for r in roots)]
    where = os.path.dirname(path)
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        if not _private(where, directory=True):
            return 0
        fd, fresh = tempfile.mkstemp(prefix=".mask-listings-", dir=where)
        try:
            with os.fdopen(fd, "wb") as f:
                marshal.dump((FORMAT, rows), f)
            os.replace(fresh, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(fresh)
            raise
    except OSError:
        return 0
    return len(rows)
