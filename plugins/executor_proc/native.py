"""The native launcher: build ``launcher/sb_launch.c`` once, cache it, and find it again.

The binary is cached as ``sb_launch-<sha256 of source, flags and tool chain>`` in a directory only
this user can write (checked, since whoever can swap the binary owns every sandbox), built to a
temp name and renamed into place so concurrent engines never see half a file. Static linking
when the C library allows it: nothing to resolve at exec, and nothing to bind inside the sandbox.

musl (``musl-gcc``, Debian's ``musl-tools``) is preferred when installed: the launcher is
exec'ed inside every sandbox on the call's path, and a glibc program's start asks the CPU about
itself (``cpuid``) dozens of times, each a trap to the hypervisor on a VM: 0.55 ms of CPU per
start here against 0.06 ms for the same launcher on musl. gcc with glibc is the fallback.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from policy_engine.sandbox import enginedirs

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
    return Path(enginedirs.launcher_cache_dir(os.environ))


class LauncherRefused(OSError):
    """The cached launcher (or a directory above it) is no longer the engine's alone."""


def open_verified(path: str) -> int:
    """A descriptor of the launcher at ``path``, checked after opening: a regular file of the
    engine's uid (or root) nobody else may write, in directories nobody else may write up to a
    root-owned one. Executing this descriptor (``/proc/self/fd/N``), never the name, means a
    swap after the check runs nothing (outsider attack round 3, F7: a sandbox that got the
    cache handed over replaced the launcher, and the next command ran it as root).

    :raises LauncherRefused: with the reason.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise LauncherRefused(err.errno, f"launcher `{path}` unusable: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        why = _owner_only(path, st, stat.S_ISREG) or _dirs_owner_only(os.path.dirname(path))
    except OSError as err:
        why = f"launcher `{path}` unusable: {err.strerror}"
    if why is not None:
        os.close(fd)
        raise LauncherRefused(1, f"launcher refused: {why}")
    return fd


def verify(path: str) -> str | None:
    """``None`` when ``path`` passes :func:`open_verified`'s checks, else why not."""
    try:
        os.close(open_verified(path))
    except LauncherRefused as exc:
        return exc.strerror
    return None


def _owner_only(path: str, st: os.stat_result, kind: Callable[[int], bool]) -> str | None:
    if not kind(st.st_mode):
        return f"`{path}` is not a {'directory' if kind is stat.S_ISDIR else 'regular file'}"
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        return f"`{path}` is writable by another user"
    return None


def _dirs_owner_only(where: str) -> str | None:
    """Each directory from ``where`` up: the engine's (or root's) and closed to others' writes,
    until one root owns (above it nobody else can rename what it holds); root's sticky ``/tmp``
    is passed (nobody else may rename our entry there)."""
    d = os.path.abspath(where)
    while True:
        st = os.lstat(d)
        if st.st_uid == 0 and stat.S_ISDIR(st.st_mode) and st.st_mode & 0o1000 and d != where:
            pass  # sticky, root's: others cannot rename or remove our entry in it
        else:
            why = _owner_only(d, st, stat.S_ISDIR)
            if why is not None:
                return why
            if st.st_uid == 0:
                return None
        if d == "/":
            return None
        d = os.path.dirname(d)


def _key(source: bytes, chain: str) -> str:
    h = hashlib.sha256(source)
    h.update("\0".join(FLAGS).encode())
    if chain != "gcc":  # the gcc-built binaries' names are unchanged
        h.update(b"\0" + chain.encode())
    return h.hexdigest()[:24]


def _attempts(musl: str | None, gcc: str | None, kernel_headers: str) -> list[list[str]]:
    """The compiler command lines to try in turn: musl static, glibc static, glibc dynamic."""
    out: list[list[str]] = []
    if musl is not None:
        # musl's include path has no kernel headers: a directory holding only links to the
        # kernel's (linux/, asm/, asm-generic/), searched after musl's own, so no glibc header
        # can stand in for a musl one
        out.append([musl, *FLAGS, "-static", "-idirafter", kernel_headers])
    if gcc is not None:
        out += [[gcc, *FLAGS, "-static"], [gcc, *FLAGS]]  # static when libc.a is there
    return out


def _link_kernel_headers(into: str) -> None:
    """Make ``into`` the kernel-headers-only include directory musl builds search."""
    multiarch = f"/usr/include/{os.uname().machine}-linux-gnu/asm"
    asm = multiarch if os.path.isdir(multiarch) else "/usr/include/asm"
    for name, target in (("linux", "/usr/include/linux"), ("asm", asm),
                         ("asm-generic", "/usr/include/asm-generic")):
        os.symlink(target, os.path.join(into, name))


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
    musl, gcc = shutil.which("musl-gcc"), shutil.which("gcc") or shutil.which("cc")
    target = where / f"sb_launch-{_key(source, 'musl' if musl else 'gcc')}"
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
    if gcc is None:
        return NativeLauncher(None, "gcc is not installed (Debian package `gcc`), so the native "
                                    "launcher cannot be built")
    tmp = headers = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".sb_launch-", dir=where)
        os.close(fd)
        headers = tempfile.mkdtemp(prefix=".sb_launch-include-", dir=where)
        _link_kernel_headers(headers)
        why = ""
        for command in _attempts(musl, gcc, headers):
            res = subprocess.run([*command, "-o", tmp, str(SOURCE)],
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
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        if headers:
            shutil.rmtree(headers, ignore_errors=True)
    return NativeLauncher(str(target), "ok")
