"""The host end of a warm container's launcher: one connection, one command at a time.

Each pool slot has a private host directory mounted read-only at ``CONTROL_DIR``, holding a copy
of ``launcher.py`` and, until the launcher connected, the listening socket ``ctl.sock``. The host
accepts exactly one connection — made by the container's PID 1 before any sandboxed code runs —
then closes and removes the socket. Commands then cost a fork inside the container instead of a
``docker exec`` (runc), with the same output bounds and wall-clock kill.
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from plugins.executor_docker.runner import Outcome
from policy_engine.capture import HeadTail
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import CancelToken

CONTROL_DIR = "/run/policy-engine-ctl"
LAUNCHER_SOURCE = Path(__file__).with_name("launcher.py")
KILL_GRACE_S = 10.0


def launcher_argv(python: str = "/usr/bin/python3") -> list[str]:
    """The warm container's command: the launcher, connecting to the control socket."""
    return [python, "-I", "-S", f"{CONTROL_DIR}/launcher.py", f"{CONTROL_DIR}/ctl.sock"]


class ControlBroken(Exception):
    """The launcher connection is unusable: the slot must be replaced."""


class Control:
    """Listens in ``directory`` for the launcher, then runs commands over its connection."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        shutil.copyfile(LAUNCHER_SOURCE, directory / "launcher.py")
        (directory / "launcher.py").chmod(0o644)
        self._path = directory / "ctl.sock"
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self._path))
        self._path.chmod(0o666)  # the container's uid 1000 connects
        self._listener.listen(1)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.broken = False
        # called once a call's kill is sent: the pool gives the container back the CPU the
        # launcher needs to kill and report (the call's own quota may be a hundredth of a core)
        self.on_kill: Callable[[], None] | None = None

    def accept(self, timeout_s: float) -> None:
        """Take the launcher's connection; then nobody else can connect (socket removed)."""
        listener = self._listener
        if listener is None:
            return
        listener.settimeout(timeout_s)
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                    "warm container launcher did not connect",
                                    audit={"error": str(exc)}) from None
        finally:
            listener.close()
            self._listener = None
            self._path.unlink(missing_ok=True)
        self._sock = conn

    @property
    def alive(self) -> bool:
        return self._sock is not None and not self.broken

    def connected(self) -> bool:
        """``alive``, and the launcher has not hung up since (its container was killed or
        stopped between calls): one non-blocking peek, no round trip."""
        sock = self._sock
        if sock is None or self.broken or not self._lock.acquire(blocking=False):
            return self.alive
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            # nothing to read: still connected; readable between calls: a hang-up (b"")
            return not readable or sock.recv(1, socket.MSG_PEEK) != b""
        except (OSError, ValueError):
            return False
        finally:
            self._lock.release()

    def close(self) -> None:
        for s in (self._sock, self._listener):
            if s is not None:
                s.close()
        self._sock = self._listener = None

    def keep(self, sids: list[int]) -> None:
        """Name the sessions the launcher's kills spare (a live interpreter's), waiting for
        a running command to end; acknowledged by a ``K`` frame.

        :raises ControlBroken: the connection failed.
        """
        with self._lock:
            sock = self._sock
            if sock is None or self.broken:
                raise ControlBroken("launcher not connected")
            try:
                sock.settimeout(10.0)
                sock.sendall(json.dumps({"keep": sids}).encode() + b"\n")
                if sock.recv(5, socket.MSG_WAITALL) != b"K\0\0\0\0":
                    raise ValueError("no keep acknowledgement")
            except (OSError, ValueError) as exc:
                self.broken = True
                raise ControlBroken(str(exc)) from exc

    def run(self, argv: list[str], env: dict[str, str], cwd: str, limits: tuple[int, int],
            deadline: float, cancel: CancelToken | None = None,
            stdin_b64: str | None = None, seccomp_hex: str | None = None,
            on_output: Callable[[str, bytes], None] | None = None
            ) -> tuple[Outcome, bool]:
        """Run ``argv``; return its outcome and whether the artifacts directory has entries.
        ``seccomp_hex``: a filter the launcher installs in the command before it runs;
        ``on_output``: sees each ``O``/``E`` frame's bytes as the frame arrives.

        :raises ControlBroken: the connection failed (the caller maps it to an error and the
            slot is replaced on release).
        """
        out = Outcome(HeadTail(limits[0]), HeadTail(limits[1]), on_output=on_output)
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            out.timed_out, out.ended = True, time.time()
            return out, False
        try:
            return self._run(out, argv, env, cwd, deadline, cancel, stdin_b64, seccomp_hex)
        except (OSError, ValueError, EOFError) as exc:
            self.broken = True
            raise ControlBroken(str(exc)) from exc
        finally:
            out.close()
            self._lock.release()

    def _run(self, out: Outcome, argv: list[str], env: dict[str, str], cwd: str,
             deadline: float, cancel: CancelToken | None,
             stdin_b64: str | None, seccomp_hex: str | None = None) -> tuple[Outcome, bool]:
        sock = self._sock
        if sock is None or self.broken:
            raise ControlBroken("launcher not connected")
        out.started = time.time()
        req: dict[str, object] = {"argv": argv, "env": env, "cwd": cwd}
        if stdin_b64 is not None:
            req["stdin_b64"] = stdin_b64
        if seccomp_hex is not None:
            req["seccomp"] = seccomp_hex
        sock.settimeout(max(0.001, deadline - time.monotonic()))  # stdin may be megabytes
        sock.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        end = deadline
        while True:
            while len(buf) >= 5:
                kind = buf[:1]
                (size,) = struct.unpack(">I", buf[1:5])
                if len(buf) < 5 + size:
                    break
                data, buf = buf[5:5 + size], buf[5 + size:]
                if kind == b"O":
                    out.feed("stdout", data)
                elif kind == b"E":
                    out.feed("stderr", data)
                elif kind == b"X":
                    if buf:
                        raise ValueError("data after the exit frame")
                    done = json.loads(data)
                    out.ended = time.time()
                    if not (out.timed_out or out.cancelled):
                        out.exit_code = int(done["exit"])
                    return out, bool(done["artifacts"])
                else:
                    raise ValueError("unknown frame")
            left = end - time.monotonic()
            stop = cancel is not None and cancel.cancelled and not out.cancelled \
                and not out.timed_out
            if left <= 0 or stop:
                if out.timed_out or (out.cancelled and left <= 0):
                    raise TimeoutError("launcher did not report after the kill")
                out.cancelled, out.timed_out = stop, not stop
                sock.sendall(b'{"kill": true}\n')
                end = time.monotonic() + KILL_GRACE_S
                if self.on_kill is not None:
                    self.on_kill()
                continue
            # a pending cancellation is looked at every 50 ms
            sock.settimeout(min(left, 0.05) if cancel is not None else left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise EOFError("launcher connection closed")
            buf += chunk
