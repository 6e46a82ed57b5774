"""The long-lived Python interpreter a stateful session runs inside its sandbox (stdlib only).

Started as ``python3 -c <this file>`` under the session's bubblewrap plan with a socket as its
stdin: the engine's end of that socket pair carries the protocol, in frames of one type byte
and a 4-byte big-endian length: engine → interpreter ``C`` (the code of one call, UTF-8);
interpreter → engine ``R`` (ready, once: JSON) and ``D`` (the call ended: JSON ``{"ok": bool,
"error": name | null}``). The code's stdout and stderr are the process's own pipes, which the
engine reads directly (a child it spawns writes there too, and what a crash leaves in them is
kept); the code's stdin is ``/dev/null``. Everything here belongs to the caller (the code can
read or forge frames): the engine bounds every frame and trusts them for nothing but the end of
the call's own output.

Framed mode (``python3 -c <this file> framed <seccomp hex or -> <cpu seconds>``, a docker
session's ``docker exec``: plugins/executor_docker/interpreter.py): the protocol's replies go to
the original stdout, the only channel an exec has; the code's stdout and stderr are pipes this
process reads and frames itself (``O``/``E``), drained before each ``D`` so a call's output never
lands after its end. It first makes itself a session leader (the container's launcher spares
that session between calls), sets its CPU-time backstop and installs the seccomp filter the
engine passed (network off: no AF_UNIX), all before any code runs; ``R`` carries its pid.
"""

import contextlib
import ctypes
import io
import json
import linecache
import os
import resource
import select
import struct
import sys
import threading
import traceback

_MAX_CODE = 16 << 20


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _confine(hex_prog: str, cpu_s: int) -> None:
    """Framed mode's setup before any code: own session, CPU backstop, seccomp filter."""
    with contextlib.suppress(OSError):
        os.setsid()  # runc starts an exec's process as a session leader already: EPERM
    if os.getsid(0) != os.getpid():
        # the launcher spares exactly this session between calls: never run code outside one
        print("interpreter: not a session leader", file=sys.stderr, flush=True)
        os._exit(72)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    if hex_prog != "-":
        code = bytes.fromhex(hex_prog)
        buf = ctypes.create_string_buffer(code, len(code))
        prog = _Fprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p).value)
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        if prctl(38, 1, 0, 0, 0) != 0 or prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
            os._exit(71)  # NO_NEW_PRIVS, SECCOMP_MODE_FILTER: never run code unfiltered


class _Pump:
    """Framed mode: the code's stdout/stderr pipes read and framed onto ``proto``; reads and
    writes happen under one lock, so :meth:`drain` leaves nothing in flight."""

    def __init__(self, proto: int) -> None:
        self.proto, self.lock, self.fds = proto, threading.Lock(), {}
        for fd, tag in ((1, b"O"), (2, b"E")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            os.set_blocking(r, False)
            self.fds[r] = tag
        threading.Thread(target=self._run, daemon=True).start()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.proto, view):]

    def _take(self, fd: int) -> bool:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if data:
            self.write(self.fds[fd] + struct.pack(">I", len(data)) + data)
        return bool(data)

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select(list(self.fds), [], [])
            with self.lock:
                for fd in ready:
                    self._take(fd)

    def drain(self) -> None:
        for fd in self.fds:
            for _ in range(256):  # bounded: a busy background writer cannot hold the end
                if not self._take(fd):
                    break


def _main() -> None:
    framed = sys.argv[1:2] == ["framed"]
    if framed:
        _confine(sys.argv[2], int(sys.argv[3]))
    proto = os.dup(0)
    reply = os.dup(1) if framed else proto
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    pump = _Pump(reply) if framed else None
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)  # a print streams as it is made

    def send(tag: bytes, doc: dict[str, object]) -> None:
        payload = json.dumps(doc).encode()
        data = tag + struct.pack(">I", len(payload)) + payload
        if pump is None:
            view = memoryview(data)
            while view:
                view = view[os.write(proto, view):]
            return
        with pump.lock:  # what the code wrote goes first, then its end
            pump.drain()
            pump.write(data)

    def read_exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            part = os.read(proto, n - len(buf))
            if not part:
                os._exit(0)  # the engine closed the channel: the session ended
            buf += part
        return bytes(buf)

    names = {"__name__": "__main__", "__builtins__": __builtins__}
    cells = 0
    send(b"R", {"python": sys.version.split()[0], "pid": os.getpid(), "sid": os.getsid(0)})
    while True:
        tag, size = struct.unpack(">cI", read_exact(5))
        if tag != b"C" or size > _MAX_CODE:
            os._exit(70)  # not the engine's frame: nothing is run
        code = read_exact(size).decode("utf-8", "surrogateescape")
        error = None
        cells += 1
        name = f"<cell {cells}>"  # a traceback shows the cell's lines, as a notebook does
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            exec(compile(code, name, "exec"), names)  # noqa: S102 -- its purpose
        except BaseException as exc:  # noqa: BLE001 -- SystemExit too: the interpreter stays
            error = type(exc).__name__
            tb = exc.__traceback__
            traceback.print_exception(type(exc), exc, tb.tb_next if tb else None)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            # a stream the code replaced or closed
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]  # None: suppressed as well
        send(b"D", {"ok": error is None, "error": error})


if __name__ == "__main__":  # `python3 -c` runs it as __main__; importing runs nothing
    _main()
