"""One syscall asks the kernel whether a path holds a symlink: openat2(2) with RESOLVE_NO_SYMLINKS.

``paths.resolve_normalized`` walks a path with one ``lstat`` per component (about 1.3 µs each
here). When no component is a link, which is nearly always, that walk only confirms the path as
it is. ``openat2(AT_FDCWD, path, O_PATH, RESOLVE_NO_SYMLINKS)`` walks the whole path in the
kernel and fails with ``ELOOP`` at the first symlink, so one call (plus ``close``) answers for
every component. Measured on the benchmark host (µs): ``lstat`` 1.3 (existing) / 1.4 (missing,
with the exception); this probe through ctypes 2.1 (existing, with ``close``) / 1.6 (missing),
later 1.06 / 0.98, and native (``_nofollow.c``) 0.59 / 0.50; ``open(O_PATH)`` +
``readlink(/proc/self/fd/N)`` + ``close`` 5.3; ``os.path.realpath`` 6.7.

The probe only ever confirms the lexical path; anything else (a link anywhere, an error, no
``openat2``) sends the caller to the exact walk. An ``O_PATH`` descriptor opens nothing (no
FIFO blocks, no device is touched); it is closed at once.

:func:`probe` is the native one (``_nofollow.c``, built by ``pip install`` where a C compiler
and Python's headers are present) when it was built, else :func:`ctypes_probe`: same answers
(both are tested on the same paths), the native one ≈ 0.5 µs faster on every fs decision;
:data:`NATIVE` says which one runs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

NO_LINK: Final = 0
"""Every component exists and none is a symlink."""
MISSING: Final = 1
"""A component is missing and none before it is a symlink (the kernel walks in order)."""
UNKNOWN: Final = 2
"""A symlink, another error, or no openat2 here: walk the path component by component."""

_SYS_OPENAT2: Final[dict[str, int]] = {"x86_64": 437, "aarch64": 437}
_RESOLVE_NO_MAGICLINKS: Final = 0x02
_RESOLVE_NO_SYMLINKS: Final = 0x04


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def _setup() -> tuple[Any, tuple[Any, ...]] | None:
    """The libc ``syscall`` function and its fixed arguments, or ``None`` where it cannot run."""
    nr = _SYS_OPENAT2.get(platform.machine())
    if not sys.platform.startswith("linux") or nr is None or not hasattr(os, "O_PATH"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    # every argument as a C long: syscall(2) reads its variadic arguments as longs
    return syscall, (ctypes.c_long(nr), ctypes.c_long(-100), ctypes.byref(how),
                     ctypes.c_long(ctypes.sizeof(how)), how)  # `how` kept alive here


_SETUP = _setup()
_UTF8 = sys.getfilesystemencoding().lower().replace("-", "") == "utf8"


def available() -> bool:
    """Whether the probe can answer here (Linux ≥ 5.6 without a filter hiding openat2)."""
    if NATIVE and native is not None:
        return bool(native.available())
    return _SETUP is not None


def _encoded(path: str) -> bytes:
    """``path`` as os functions pass it to the kernel, refused as they refuse it: a C string
    ends at a NUL, so ctypes would hand over the shorter path before it (ValueError instead)."""
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, not {type(path).__name__}")
    raw = path.encode("utf-8", "surrogateescape") if _UTF8 else os.fsencode(path)
    if b"\x00" in raw:
        raise ValueError("embedded null byte")
    return raw


Stat = tuple[int, int]
"""``(st_mode, st_size)`` of the path, as ``lstat`` would say them: all the guard's fs facts
read (``fsfacts.fs_refusal``), without building an ``os.stat_result``."""


def ctypes_probe(path: str, with_stat: bool = False) -> tuple[int, Stat | None]:
    """:data:`NO_LINK`, :data:`MISSING` or :data:`UNKNOWN` for absolute ``path``, and with
    ``with_stat``, for :data:`NO_LINK`, what ``lstat`` would say of ``path`` (:data:`Stat`):
    the ``fstat`` of the descriptor the probe opened (no second walk of the path); a failing
    ``fstat`` answers :data:`UNKNOWN` (the caller walks the path)."""
    global _SETUP
    if _SETUP is None:
        return _UNKNOWN
    syscall, (nr, cwd, how, size, _) = _SETUP
    fd = syscall(nr, cwd, _encoded(path), how, size)
    if fd >= 0:
        try:
            if not with_stat:
                return _NO_LINK
            st = os.fstat(fd)
            return NO_LINK, (st.st_mode, st.st_size)
        except OSError:
            return _UNKNOWN
        finally:
            os.close(fd)
    err = ctypes.get_errno()
    if err == errno.ENOENT:
        return _MISSING
    if err == errno.ENOSYS:  # an old kernel or a seccomp filter: stop asking
        _SETUP = None
    return _UNKNOWN


# the answers without a stat, built once
_NO_LINK: Final = (NO_LINK, None)
_MISSING: Final = (MISSING, None)
_UNKNOWN: Final = (UNKNOWN, None)

Probe = Callable[..., tuple[int, Stat | None]]
native: ModuleType | None
try:
    from policy_engine.guard import _nofollow as native
except ImportError:  # not built here (no compiler or headers at install, or not Linux)
    native = None

NATIVE: Final = native is not None and _SETUP is not None
"""Whether :func:`probe` is the native extension (else the ctypes one)."""
probe: Probe = native.probe if NATIVE and native is not None else ctypes_probe
"""``probe(path, with_stat=False)``: :func:`ctypes_probe`'s contract, native when built."""


def real_path(path: str) -> str:
    """``os.path.realpath`` of absolute, normalized ``path``, answered by one probe when no
    component is a symlink (nearly always): a forbid pattern or root costs ≈ 0.5 µs, not a
    Python ``lstat`` per component (what compiling a thousand-rule policy's forbids spent)."""
    if probe(path)[0] != UNKNOWN:  # every component exists, or stops existing, link-free
        return path
    return os.path.realpath(path)


def open_no_symlinks(path: str) -> int:
    """An ``O_PATH`` descriptor of absolute ``path`` opened with no symlink in any component
    (``openat2`` ``RESOLVE_NO_SYMLINKS``; where that cannot run, ``O_NOFOLLOW``: the last
    component only). Raises ``OSError`` (``ELOOP`` for a link)."""
    if _SETUP is not None:
        syscall, (nr, cwd, how, size, _) = _SETUP
        fd = int(syscall(nr, cwd, _encoded(path), how, size))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, os.strerror(err), path)
    return os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
