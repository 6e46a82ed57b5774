"""In-container launcher: PID 1 of a warm container, running the commands the host sends.

Standard library only (the project is not mounted inside). Started as the container's command,
it connects once to the host's control socket (mounted read-only; the host accepts exactly this
one connection, then removes the socket, so nothing started later can reach it) and then, per
request line ``{"argv", "env", "cwd", "stdin_b64"?}``, forks the command with exactly that
environment, the request's stdin (else none) and no inherited descriptors, and streams frames
back: ``O``/``E`` + length + bytes for stdout/stderr, then ``X`` + length + JSON ``{"exit",
"artifacts"}``. A ``{"kill": true}`` line while a command runs kills every other process of
the container (``kill(-1, SIGKILL)``; PID 1 itself is immune to signals sent from inside its
namespace); so does the end of every command, so nothing a call started outlives it. It
makes itself non-dumpable so a sandboxed process of the same uid cannot ptrace it or write its
memory.

A ``{"keep": [sid, ...]}`` line between commands names the sessions those kills spare: a
stateful docker session's live interpreter (its own ``docker exec``, a session leader:
plugins/executor_docker/interpreter.py) and what it started outlive the session's other
calls. ``{"keep": []}`` forgets them (the interpreter was killed: its pid may be reused).

This replaces ``docker exec`` (≈ 30–50 ms of runc per call) on the warm path; resource limits are
the container's cgroup, the uid is the container's user (1000).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

ARTIFACTS = "/workspace/artifacts"
PR_SET_DUMPABLE = 4
DRAIN_S = 0.05
KILL_ROUNDS = 2500  # ~5 s for a process stuck in uninterruptible sleep to die


def _frame(sock: socket.socket, kind: bytes, data: bytes) -> None:
    sock.sendall(kind + struct.pack(">I", len(data)) + data)


def _artifacts() -> bool:
    try:
        with os.scandir(ARTIFACTS) as it:
            return any(True for _ in it)
    except OSError:
        return False


def _feed(pipe: Any, data: bytes) -> None:
    """Write the call's stdin, then close it (EOF); a command that exits first ends it."""
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _reap() -> None:
    """PID 1 reaps orphans (only after the command itself was waited for)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


KEEP: set[int] = set()  # sessions the kills spare (the host's ``keep`` line)


def _sid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[3])  # field 6: the session id


def _kill_all() -> bool:
    """SIGKILL every process but PID 1 and the kept sessions; whether any was found."""
    if not KEEP:
        try:
            os.kill(-1, signal.SIGKILL)  # every process PID 1 may signal, never itself
        except ProcessLookupError:
            return False
        return True
    found = False
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1":
            continue
        sid = _sid(int(name))
        if sid is not None and sid not in KEEP:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)
                found = True
    return found


def _kill_the_rest() -> None:
    """No process of the call outlives it: a background child (its own session, its output
    elsewhere) would run on into the session's next call, outside its deadline and evidence.
    Every process but PID 1 is the call's (one command at a time per container), so all are
    killed and reaped before the exit frame — and so before the artifacts are looked at."""
    for _ in range(KILL_ROUNDS):
        if not _kill_all():
            return  # none left (zombies count as found: they were reaped below)
        time.sleep(0.002)
        _reap()


def _exit_fd(child: subprocess.Popen[bytes]) -> int:
    """A descriptor that turns readable when ``child`` exits: its pidfd, or where the kernel has
    no ``pidfd_open`` (gVisor's runsc of Debian 12: ENOSYS) a pipe closed by a waiting thread."""
    try:
        return os.pidfd_open(child.pid)
    except OSError:
        r, w = os.pipe()

        def wait() -> None:
            child.wait()
            os.close(w)

        threading.Thread(target=wait, daemon=True).start()
        return r


class Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def lines(self) -> list[bytes]:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        return [d for d in done if d.strip()]

    def next_line(self) -> bytes:
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _filter_installer(hex_prog: str) -> Any:
    """A ``preexec_fn`` installing the seccomp program ``hex_prog`` (built on the host:
    ``plugins.executor_proc.seccomp.unix_filter``) in the child; everything is prepared
    before the fork, the child only calls ``prctl`` (a failure fails the spawn: exit 126)."""
    code = bytes.fromhex(hex_prog)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Fprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p).value)
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def install() -> None:
        keep = (buf, prog)  # alive until the child execs
        if prctl(38, 1, 0, 0, 0) != 0 or prctl(22, 2, ctypes.byref(keep[1]), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "seccomp filter refused")  # NO_NEW_PRIVS, FILTER

    return install


def run(conn: Conn, req: dict[str, Any]) -> None:
    sock = conn.sock
    argv = [str(a) for a in req["argv"]]
    filt = req.get("seccomp")
    env = {str(k): str(v) for k, v in req["env"].items()}
    stdin = base64.b64decode(req["stdin_b64"]) if req.get("stdin_b64") is not None else None
    try:
        child = subprocess.Popen(argv, env=env, cwd=str(req["cwd"]),
                                 stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 close_fds=True, start_new_session=True,
                                 preexec_fn=_filter_installer(str(filt)) if filt else None)
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        _frame(sock, b"E", f"launcher: cannot run {argv[0]}: {exc.strerror}\n".encode())
        _frame(sock, b"X", json.dumps({"exit": code, "artifacts": _artifacts()}).encode())
        return
    if child.stdout is None or child.stderr is None:  # INVARIANT: both are PIPE
        raise RuntimeError("no pipes")
    if stdin is not None and child.stdin is not None:
        # on a thread: a command that reads nothing must not block the output frames
        threading.Thread(target=_feed, args=(child.stdin, stdin), daemon=True).start()
    pidfd = _exit_fd(child)
    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ, b"O")
    sel.register(child.stderr, selectors.EVENT_READ, b"E")
    sel.register(sock, selectors.EVENT_READ, b"C")
    sel.register(pidfd, selectors.EVENT_READ, b"P")
    exited = False
    open_pipes = 2
    while open_pipes:
        # after the command ended, background processes may hold the pipes: drain, not wait
        events = sel.select(DRAIN_S if exited else None)
        if not events and exited:
            break
        for key, _ in events:
            tag = key.data
            if tag == b"P":
                exited = True
                sel.unregister(pidfd)
            elif tag == b"C":
                try:
                    lines = conn.lines()
                except EOFError:
                    os.kill(-1, signal.SIGKILL)
                    os._exit(0)
                if any(json.loads(line).get("kill") for line in lines):
                    _kill_all()
            else:
                data = os.read(key.fd, 65536)
                if data:
                    _frame(sock, tag, data)
                else:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
    sel.close()
    os.close(pidfd)
    code = child.wait()
    child.stdout.close()
    child.stderr.close()
    _kill_the_rest()
    _frame(sock, b"X", json.dumps({"exit": 128 - code if code < 0 else code,
                                   "artifacts": _artifacts()}).encode())


def main(path: str) -> int:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    conn = Conn(sock)
    while True:
        try:
            line = conn.next_line()
        except EOFError:
            return 0
        req = json.loads(line)
        if "keep" in req:
            KEEP.clear()
            KEEP.update(int(s) for s in req["keep"])
            _frame(conn.sock, b"K", b"")
            continue
        if req.get("kill"):
            continue  # a kill that arrived after its command ended
        run(conn, req)
        _reap()


if __name__ == "__main__":
    os._exit(main(sys.argv[1]))
