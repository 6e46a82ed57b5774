"""The native launcher: build ``launcher/sb_launch.c`` once with gcc, cache it, and find it again.

The binary is cached as ``sb_launch-<sha256 of source and flags>`` in a directory only this user
can write (checked, since whoever can swap the binary owns every sandbox), built to a temp name
and renamed into place so concurrent engines never see half a file. Static linking when the C
library allows it: nothing to resolve at exec, and nothing to bind inside the sandbox.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "launcher" / "sb_launch.c"
FLAGS = ("-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fstack-protector-strong",
         "-D_FORTIFY_SOURCE=2")
_lock = threading.Lock()
_cache: dict[Path, NativeLauncher] = {}


@dataclass(frozen=True, slots=True)
class NativeLauncher:
    """Where the launcher is, or why there is none (``path`` is ``None`` then)."""

    path: str | None
    reason: str


def default_cache_dir() -> Path:
    """``$POLICY_ENGINE_STATE/bin``, else ``$XDG_CACHE_HOME/policy-engine/bin`` (``~/.cache``)."""
    state = os.environ.get("POLICY_ENGINE_STATE")
    if state:
        return Path(state).expanduser().absolute() / "bin"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "policy-engine" / "bin"


def _key(source: bytes) -> str:
    h = hashlib.sha256(source)
    h.update("\0".join(FLAGS).encode())
    return h.hexdigest()[:24]


def _private(path: Path, *, directory: bool) -> str | None:
    """``None`` when ``path`` is ours and writable by nobody else, else why not."""
    st = os.lstat(path)
    if directory and not stat.S_ISDIR(st.st_mode) or not directory and not stat.S_ISREG(
            st.st_mode):
        return f"`{path}` is not a {'directory' if directory else 'regular file'}"
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"`{path}` is writable by another user"
    return None


def launcher(cache_dir: Path | None = None) -> NativeLauncher:
    """Return the cached launcher, building it on first use (once per process and directory)."""
    where = (cache_dir or default_cache_dir()).absolute()
    with _lock:
        found = _cache.get(where)
        if found is None:
            found = _cache[where] = _build(where)
        return found


def _build(where: Path) -> NativeLauncher:
    try:
        source = SOURCE.read_bytes()
    except OSError as err:
        return NativeLauncher(None, f"launcher source unreadable: {err.strerror}")
    target = where / f"sb_launch-{_key(source)}"
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = _private(where, directory=True)
        if why is None and target.exists():
            why = _private(target, directory=False)
            return NativeLauncher(None if why else str(target), why or "ok")
    except OSError as err:
        return NativeLauncher(None, f"launcher cache `{where}` unusable: {err.strerror}")
    if why is not None:
        return NativeLauncher(None, f"launcher cache refused: {why}")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return NativeLauncher(None, "gcc is not installed (Debian package `gcc`), so the native "
                                    "launcher cannot be built")
    fd, tmp = tempfile.mkstemp(prefix=".sb_launch-", dir=where)
    os.close(fd)
    try:
        why = ""
        for extra in (["-static"], []):  # static when libc.a is there, else dynamic
            res = subprocess.run([gcc, *FLAGS, *extra, "-o", tmp, str(SOURCE)],
                                 capture_output=True, text=True, timeout=120, check=False)
            if res.returncode == 0:
                break
            why = res.stderr.strip()[-300:]
        else:
            return NativeLauncher(None, f"building the native launcher failed: {why}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return NativeLauncher(None, f"building the native launcher failed: {exc}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return NativeLauncher(str(target), "ok")
