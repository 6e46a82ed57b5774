"""Where the analysed LALR tables of the grammar are kept between runs (Lark's ``cache=``).

Building the parser from the grammar costs ≈ 70–100 ms on every start; loading Lark's cache of
the analysis costs ≈ 10 ms. Lark's cache is a pickle, so it is only ever read from a directory
this user owns and nobody else can write (``$POLICY_ENGINE_STATE/cache``, else
``$XDG_CACHE_HOME/policy-engine`` or ``~/.cache/policy-engine``), never from a shared temp dir;
it is written under a private name and renamed into place, so a concurrent start never reads a
half-written file. ``POLICY_ENGINE_GRAMMAR_CACHE=0`` turns it off. Any problem means no cache:
the parser is then built as it always was.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path

DISABLE_ENV = "POLICY_ENGINE_GRAMMAR_CACHE"


def cache_dir() -> Path:
    state = os.environ.get("POLICY_ENGINE_STATE")
    if state:
        return Path(state).expanduser().absolute() / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg).absolute() / "policy-engine"


def _private(path: Path, *, directory: bool) -> bool:
    """``path`` is a directory (or regular file) of this user that nobody else may write."""
    st = os.lstat(path)
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    return kind_ok and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def cache_file(grammar: str, options: str, lark_version: str) -> tuple[Path, Path] | None:
    """``(target, fresh)``: the cache file for this grammar and Lark, and a private name to
    build a missing one under (renamed onto ``target`` by :func:`publish`); ``None``: no cache.
    """
    if os.environ.get(DISABLE_ENV, "1") in ("0", "false", "no", "off"):
        return None
    key = hashlib.sha256("\0".join((grammar, options, lark_version)).encode()).hexdigest()[:24]
    where = cache_dir()
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(where, directory=True):
            return None
        target = where / f"sbpolicy-grammar-{key}.lark"
        if target.exists() or target.is_symlink():
            return (target, target) if _private(target, directory=False) else None
        fd, fresh = tempfile.mkstemp(prefix=".sbpolicy-grammar-", dir=where)
        os.close(fd)
        os.unlink(fresh)  # Lark writes the name itself; only the unique name was wanted
        return target, Path(fresh)
    except OSError:
        return None


def publish(target: Path, fresh: Path) -> None:
    """Move a freshly written cache into place (atomic); a failure leaves no file behind."""
    if fresh == target:
        return
    try:
        if fresh.exists():
            os.replace(fresh, target)
    except OSError:
        with contextlib.suppress(OSError):
            fresh.unlink()
