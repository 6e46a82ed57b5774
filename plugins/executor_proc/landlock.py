"""Landlock (syscalls 444–446) through ctypes: ABI probe, path rules, TCP and scope limits.

Standard library only: this module also runs inside the sandbox, loaded by ``launcher.py``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
from collections.abc import Iterable

_NR = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

# filesystem access rights, by the ABI that introduced them
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
              5: (1 << 16) - 1}
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

RO = READ_FILE | READ_DIR
ROX = RO | EXECUTE
# a writable tree is executable too (outsider attack round 3, F6): `./configure`, `.venv/bin/*`,
# built binaries; refusing it gained nothing (`sh ./s.sh`, `python x.py` ran anyway) and what runs
# inherits this Landlock domain, the seccomp filter and no_new_privs (no set-id gain)
RW = (RO | EXECUTE | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK
      | MAKE_FIFO | MAKE_SYM | REFER | TRUNCATE)
CREATE_ONLY = READ_DIR | MAKE_REG | MAKE_DIR  # a carved rw parent: add files, never remove secrets
DEV = RO | WRITE_FILE | IOCTL_DEV  # /dev/null, /dev/tty: writes go nowhere harmful
HOST = ROX | IOCTL_DEV  # the local runner's host tree: read, run; the uid's permissions decide
ACCESS = {"ro": RO, "rox": ROX, "rw": RW, "create": CREATE_ONLY, "dev": DEV, "list": READ_DIR,
          "host": HOST}


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)


def _nr() -> tuple[int, int, int] | None:
    return _NR.get(platform.machine())


def abi_version() -> int:
    """The kernel's Landlock ABI (0 when unsupported or disabled at boot)."""
    nr = _nr()
    if nr is None:
        return 0
    v = _libc.syscall(nr[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(v))


def handled_fs(abi: int) -> int:
    return _FS_BY_ABI.get(abi, _FS_BY_ABI[5]) if abi > 0 else 0


class LandlockError(OSError):
    """Landlock could not be applied; the message says which step."""


def restrict(rules: Iterable[tuple[str, str]], *, deny_tcp: bool, scope: bool,
             connect_ports: Iterable[int] = (), bind_ports: Iterable[int] = (),
             fs: bool = True) -> int:
    """Restrict this process (and its future children) to ``rules``; returns the ABI used.

    :param rules: ``(path, access)`` with access a key of ``ACCESS``; missing paths are skipped.
    :param deny_tcp: handle TCP bind/connect, so both are refused but for the ports below
        (ABI ≥ 4).
    :param connect_ports: with ``deny_tcp``, TCP ports that may still be connected to.
    :param bind_ports: with ``deny_tcp``, TCP ports that may still be bound.
    :param scope: refuse signals and abstract Unix sockets leaving the domain (ABI ≥ 6).
    :param fs: handle filesystem rights; ``False`` makes a network-only layer on top of another.
    :raises LandlockError: when the kernel lacks Landlock or a step fails.
    """
    abi = abi_version()
    nr = _nr()
    if abi <= 0 or nr is None:
        raise LandlockError("landlock is not supported by this kernel")
    if not fs and not (deny_tcp and abi >= 4):
        raise LandlockError("landlock TCP rules need ABI 4")
    fs_mask = handled_fs(abi) if fs else 0
    attr = _RulesetAttr(fs_mask, NET_BIND_TCP | NET_CONNECT_TCP if deny_tcp and abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if scope and abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = _libc.syscall(nr[0], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        ports = [(p, NET_CONNECT_TCP) for p in connect_ports]
        ports += [(p, NET_BIND_TCP) for p in bind_ports]
        for port, right in ports if deny_tcp and abi >= 4 else ():
            net = _NetPort(right, port)
            if _libc.syscall(nr[1], fd, _RULE_NET_PORT, ctypes.byref(net),
                             ctypes.c_uint32(0)) != 0:
                raise LandlockError(ctypes.get_errno(), "landlock_add_rule failed for a TCP port")
        for path, access in rules if fs else ():
            _add_rule(nr[1], fd, path, ACCESS[access] & fs_mask)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if _libc.syscall(nr[2], fd, ctypes.c_uint32(0)) != 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)
    return abi


def _add_rule(nr_add: int, ruleset_fd: int, path: str, access: int) -> None:
    try:  # O_NOFOLLOW: a link planted in a writable tree must not make the rule grant its target
        pfd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # absent inside this sandbox: nothing to allow
    try:
        mode = os.fstat(pfd).st_mode
        if stat.S_ISLNK(mode):
            return
        if not stat.S_ISDIR(mode):
            access &= _FILE_ONLY  # directory-only rights on a file are EINVAL
        if access == 0:
            return
        attr = _PathBeneath(access, pfd)
        if _libc.syscall(nr_add, ruleset_fd, _RULE_PATH_BENEATH, ctypes.byref(attr),
                         ctypes.c_uint32(0)) != 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(pfd)
