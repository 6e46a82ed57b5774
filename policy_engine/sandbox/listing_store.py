"""The mask planner's walks of the system trees kept on disk between runs (issue 27 item 4).

A fresh process's first plan of the system trees listed ~26,000 directories (≈ 0.65–1.3 s);
kept listings still cost a walk and building 26,000 listings (≈ 0.5 s). What is kept now is the
walk's *result* per record (``masks._WalkRecord``: each directory's frame, its masked names,
and the ``(st_dev, st_ino, st_ctime_ns)`` it was listed under) in a compact form: the
directories as one NUL-separated blob, the stamps as fixed 24-byte records, the frames as
indexes into a small table. A start reads it, checks every directory's stamp with one ``lstat``
(``revalidate``, in C: ≈ 1 µs a directory, two threads) after putting an inotify watch on it,
and hands the directories found changed to the first plan, which lists only those (and any new
directory beneath them). A stored walk is never used without that check: a secret planted while
the engine was stopped changes its directory's ctime, which no process can set back, so the
first plan after the restart lists the directory and masks it
(``tests/integration/test_listing_store_sandbox.py``). A directory listed less than
``RACY_NS`` after its last change is stored with a stamp that never matches.

The file holds ``marshal`` data, so it is read only from a regular file this user owns in a
directory this user owns and nobody else can write (``$POLICY_ENGINE_STATE/cache``, else
``$XDG_CACHE_HOME/policy-engine`` or ``~/.cache/policy-engine``), and written under a private
name then renamed into place. Any problem means no stored walk: the first plan walks, as
before. ``POLICY_ENGINE_LISTING_CACHE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import stat
import struct
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from policy_engine.sandbox import enginedirs
from policy_engine.sandbox.masks import (
    _MEMO,
    DirCache,
    _compile,
    _Frame,
    _frame,
    _WalkRecord,
    beneath,
    mount_points,
)
from policy_engine.sandbox.revalidate import STAMP, UNTRUSTED
from policy_engine.sandbox.revalidate import changed as changed_dirs
from policy_engine.sandbox.watch import MASK as WATCH_MASK

DISABLE_ENV = "POLICY_ENGINE_LISTING_CACHE"
FORMAT = 2
MAX_FILE_BYTES = 256 << 20  # bounded memory whatever lies in the file
MAX_RECORDS = 64  # walks kept (one per system tree and pattern set)
_FIDS = struct.Struct("=I")
_ENCODING = sys.getfilesystemencoding()


def store_path() -> str | None:
    """The store file, or ``None`` when turned off."""
    if os.environ.get(DISABLE_ENV, "1") in ("0", "false", "no", "off"):
        return None
    where = enginedirs.engine_cache_dir(os.environ)  # the guard refuses it to every fs op
    return os.path.join(where, f"mask-walks-py{sys.version_info[0]}{sys.version_info[1]}.bin")


def _private(path: str, *, directory: bool) -> bool:
    st = os.lstat(path)
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    return kind_ok and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _stored(key: object, roots: Sequence[str]) -> bool:
    """A walk of system trees only, not the local runner's (whose key names a uid)."""
    if type(key) is not tuple or len(key) != 2 or key[1] is not None:
        return False
    return all(any(beneath(r, t) for t in roots) for r, _ in key[0])


def _row(key: Any, rec: _WalkRecord) -> tuple[object, ...]:
    items = list(rec.inherited.items())
    paths = [p for p, _ in items]
    frames: dict[_Frame, int] = {}
    fids = [frames.setdefault(f, len(frames)) for _, f in items]
    table = tuple(tuple(g.glob.pattern for g in f.active) for f in frames)
    have = rec.stamp_map()
    stamps = b"".join([STAMP.pack(*have.get(p, UNTRUSTED)) for p in paths])
    hits = tuple((d, tuple(sorted(h))) for d, h in list(rec.hits.items()))
    blob = b"".join([os.fsencode(p) + b"\0" for p in paths])
    return key[0], blob, stamps, b"".join([_FIDS.pack(i) for i in fids]), table, hits


def _record(row: Any) -> tuple[object, list[str], bytes, bytes, _WalkRecord]:
    """A stored row back as a record (not yet revalidated); a row of another shape is a
    ValueError (the file is this user's own: the checks catch a format change)."""
    if type(row) is not tuple or len(row) != 6:
        raise ValueError("not a stored walk")
    key0, blob, stamps, fids, table, hits = row
    if type(key0) is not tuple or type(blob) is not bytes or type(stamps) is not bytes or \
            type(fids) is not bytes or type(table) is not tuple or type(hits) is not tuple:
        raise ValueError("not a stored walk")
    for r, pats in key0:
        if type(r) is not str or type(pats) is not tuple or \
                not all(type(p) is str for p in pats):
            raise ValueError("not a stored walk")
    paths = blob.decode(_ENCODING, "surrogateescape").split("\0")[:-1] if blob else []
    if len(stamps) != STAMP.size * len(paths) or len(fids) != _FIDS.size * len(paths):
        raise ValueError("not a stored walk")
    frames = [_frame(tuple(sorted({_compile(p, "/") for p in pats},
                                  key=lambda g: g.glob.pattern)), _MEMO) for pats in table]
    ids = memoryview(fids).cast("I")
    inherited = dict(zip(paths, [frames[i] for i in ids], strict=True))  # IndexError: bad
    # checked against the stamps right after this (``load``): under the mounts of that check
    rec = _WalkRecord(0, inherited, {d: frozenset(h) for d, h in hits}, None,
                      (paths, blob, stamps), dirty=False, mounts=mount_points())
    return (key0, None), paths, blob, stamps, rec


def load(cache: DirCache, path: str | None = None, *, watch: bool = True) -> int:
    """Put the stored walks into ``cache`` (not over one it holds), each checked first: the
    directories whose stamp no longer holds are logged as changed for the next plan (with a
    usable watcher; without one that plan checks every stamp itself). Returns how many
    directories the walks hold. A missing, foreign, malformed or oversized file loads
    nothing.

    ``watch=False``: the stamps are checked without putting the watches first (half the
    syscalls): the walks serve the next plan as checked, and ``watch_loaded`` must run
    before any later one (``spec.prewarm``: the first call does not wait for the watches).
    """
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
        fmt, rows = marshal.loads(raw)  # our own file, checked private above
        if fmt != FORMAT or type(rows) is not list:
            return 0
        records = [_record(row) for row in rows[:MAX_RECORDS]]
    except (OSError, ValueError, TypeError, EOFError, IndexError):
        return 0
    watcher = cache.watcher
    n = 0
    for key, paths, blob, stamps, rec in records:
        if key in cache.walks:
            continue
        if watcher is not None and watcher.usable:
            watcher.drain()
            rec.synced = watcher.seq  # INVARIANT: read before watching
            idx, wds = changed_dirs(blob, stamps, watcher.fd if watch else -1, WATCH_MASK)
            if not watch:
                watcher.note(paths[i] for i in idx)
                rec.watched = rec.provisional = True
            elif watcher.adopt(paths, wds):
                watcher.note(paths[i] for i in idx)
                rec.watched = True
        cache.adopt_walk(key, rec)  # not ``watched``: the next plan checks every stamp
        rec.dirty = False
        n += len(paths)
    return n


def watch_loaded(cache: DirCache) -> int:
    """Watch every directory of the walks ``load(watch=False)`` took, each checked again after
    its watch is in place (against the stamp it has now): a change since the first check is
    logged for the next plan. Returns how many directories changed."""
    n = 0
    for rec in list(cache.walks.values()):
        if rec.provisional:
            changed = rec.stale(cache.watcher)
            rec.provisional = False
            if cache.watcher is not None:
                cache.watcher.note(changed)
            n += len(changed)
    return n


def unwatch_loaded(cache: DirCache) -> int:
    """Instead of ``watch_loaded``, in a process that makes one call (``spec.prewarm``): the
    walks ``load(watch=False)`` took stop standing on the check made at load, so a later plan
    checks every stamp of theirs itself (``_WalkRecord.stale``, watching them then), as for a
    walk loaded without a watcher. Returns how many records it changed."""
    n = 0
    for rec in list(cache.walks.values()):
        if rec.provisional:
            rec.watched = rec.provisional = False  # toward a check: a plan reading it midway
            n += 1                                  # checks the stamps, never trusts less
    return n


def save(cache: DirCache, roots: Sequence[str], path: str | None = None,
         *, force: bool = False) -> int:
    """Write ``cache``'s walks of the trees ``roots`` (atomically) when one changed since it was
    loaded or stored (``force``: whatever); returns how many directories they hold."""
    path = path or store_path()
    if path is None:
        return 0
    walks = [(k, r) for k, r in list(cache.walks.items()) if _stored(k, roots)][-MAX_RECORDS:]
    if not walks or not (force or any(r.dirty for _, r in walks)):
        return 0
    with cache.walk_lock:  # no record halfway through a partial re-walk
        rows = [_row(k, r) for k, r in walks]
    where = os.path.dirname(path)
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        if not _private(where, directory=True):
            return 0
        fd, fresh = tempfile.mkstemp(prefix=".mask-walks-", dir=where)
        try:
            with os.fdopen(fd, "wb") as f:
                marshal.dump((FORMAT, rows), f)
            os.replace(fresh, path)
            name = os.path.basename(path)
            if name.startswith("mask-walks-"):  # the listings of FORMAT 1, 8 MB, never read now
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(where, "mask-listings-" + name[len("mask-walks-"):]))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(fresh)
            raise
    except OSError:
        return 0
    for _, r in walks:
        r.dirty = False
    return sum(len(r.inherited) for _, r in walks)
