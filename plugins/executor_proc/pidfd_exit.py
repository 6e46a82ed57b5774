"""How a sandboxed tool ended, read from a pidfd of it: the launcher's ``-W`` instead of its fork.

Behind bwrap the engine waits for bwrap, whose pid-namespace init reports a tool killed by
signal N as exit code 128 + N, which a tool can also exit with. The in-sandbox launcher used to
fork the tool and report its wait status (``-w``): one more process and two more wake-ups per
call. With ``-W FD`` it sends a pidfd of itself on a Unix socket to the engine and execs the tool
in place (same pid): since Linux 6.15 the kernel keeps a process's wait status for the holders
of a pidfd of it once it has been reaped (``PIDFD_GET_INFO`` with ``PIDFD_INFO_EXIT``), whoever
reaped it (bwrap's init here). ``supported`` probes that once; without it the engine keeps
``-w``, and a launcher that cannot send the pidfd falls back to ``-w`` by itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import threading

PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, struct pidfd_info)
INFO_EXIT = 1 << 3
_INFO_SIZE = 64  # PIDFD_INFO_SIZE_VER0: mask, cgroupid, 11 ids, exit_code
_EXIT_CODE_AT = 60

_lock = threading.Lock()
_supported: list[bool] = []


def exit_status(pidfd: int) -> int | None:
    """The wait status the kernel kept for the (reaped) process ``pidfd`` refers to, or
    ``None`` while it runs, when it has not been reaped yet, or without the kernel's support."""
    buf = bytearray(_INFO_SIZE)
    struct.pack_into("=Q", buf, 0, INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, buf)
    except OSError:
        return None
    if not struct.unpack_from("=Q", buf, 0)[0] & INFO_EXIT:
        return None
    return int(struct.unpack_from("=i", buf, _EXIT_CODE_AT)[0])


def supported() -> bool:
    """Whether this kernel keeps a reaped child's status for its pidfds (asked once, with a
    child of our own: ``true``, its pidfd opened, reaped, then asked)."""
    with _lock:
        if not _supported:
            _supported.append(_probe())
        return _supported[0]


def _probe() -> bool:
    true = shutil.which("true") or "/bin/true"
    try:
        proc = subprocess.Popen([true], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={}, cwd="/")
    except OSError:
        return False
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        proc.wait()
        return False
    try:
        proc.wait()
        status = exit_status(pidfd)
    finally:
        os.close(pidfd)
    return status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def receive(sock: socket.socket) -> int | None:
    """The tool's wait status from the pidfd its launcher sent on ``sock`` (the first one; any
    other is closed unread), or ``None`` when none was sent or it is not known yet."""
    try:
        _, fds, _, _ = socket.recv_fds(sock, 16, 4, socket.MSG_DONTWAIT)
    except OSError:  # BlockingIOError: nothing sent (the launcher fell back to -w, or failed)
        return None
    try:
        return exit_status(fds[0]) if fds else None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def tool_end(status: int) -> dict[str, int]:
    """The launcher's ``-w`` report for a wait status: ``{"signal": N}`` or ``{"exit": N}``."""
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.waitstatus_to_exitcode(status)}
