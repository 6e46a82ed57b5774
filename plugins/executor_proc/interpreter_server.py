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
the original stdout, the only channel an exec has, through an output process forked before any
code: the code's stdout and stderr are pipes it reads and frames (``O``/``E``), drained before
each ``D`` so a call's output never lands after its end, and after a crash. It first makes
itself a session leader (the container's launcher spares that session between calls), sets its
CPU-time backstop and installs the seccomp filter the engine passed (network off: no AF_UNIX),
all before any code runs; ``R`` carries its pid.
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


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _pump(out: int, pipes: dict[int, bytes], ctl: int) -> None:
    """Framed mode's output process (forked before any code runs): frames what the code writes
    to its stdout/stderr pipes (``O``/``E``) onto the exec's stdout, and forwards the server's
    own frames from ``ctl`` after draining the pipes, so a call's output never lands after
    its end. A process of its own: what a crash (``os._exit``, a signal) left in the pipes is
    still framed, then the end of ``ctl`` ends it and with it the exec's stream."""
    for fd in pipes:
        os.set_blocking(fd, False)

    def take(fd: int) -> bool:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not data:
            del pipes[fd]
            return False
        _write(out, pipes[fd] + struct.pack(">I", len(data)) + data)
        return True

    def drain() -> None:
        for fd in list(pipes):
            for _ in range(256):  # bounded: a busy background writer cannot hold the end
                if fd not in pipes or not take(fd):
                    break

    buf = b""
    while True:
        ready, _, _ = select.select([*pipes, ctl], [], [])
        for fd in ready:
            if fd != ctl:
                if fd in pipes:
                    take(fd)
                continue
            part = os.read(ctl, 65536)
            if not part:  # the server ended (a crash): what it left, then the end
                drain()
                os._exit(0)
            buf += part
            while len(buf) >= 5:
                size = struct.unpack(">I", buf[1:5])[0]
                if len(buf) < 5 + size:
                    break
                drain()
                _write(out, buf[:5 + size])
                buf = buf[5 + size:]


def _framed_output() -> int:
    """Start the output process; the code's stdout/stderr become its pipes. Answers the
    descriptor the server's own frames go to."""
    ctl_r, ctl_w = os.pipe()
    pipes = {}
    for fd, tag in ((1, b"O"), (2, b"E")):
        r, w = os.pipe()
        pipes[r] = (w, fd, tag)
    if os.fork() == 0:  # no thread yet: a plain fork
        os.close(ctl_w)
        for w, _, _ in pipes.values():
            os.close(w)
        try:
            _pump(1, {r: tag for r, (_, _, tag) in pipes.items()}, ctl_r)
        finally:
            os._exit(70)
    os.close(ctl_r)
    for r, (w, fd, _) in pipes.items():
        os.dup2(w, fd)  # the exec's own stdout is the output process's alone from now on
        os.close(w)
        os.close(r)
    return ctl_w


def _main() -> None:
    framed = sys.argv[1:2] == ["framed"]
    if framed:
        _confine(sys.argv[2], int(sys.argv[3]))
    proto = os.dup(0)
    reply = _framed_output() if framed else proto
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)  # a print streams as it is made

    def send(tag: bytes, doc: dict[str, object]) -> None:
        payload = json.dumps(doc).encode()
        _write(reply, tag + struct.pack(">I", len(payload)) + payload)

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
        error, status = None, 1
        cells += 1
        name = f"<cell {cells}>"  # a traceback shows the cell's lines, as a notebook does
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            exec(compile(code, name, "exec"), names)  # noqa: S102 -- its purpose
        except SystemExit as exc:  # the cell's exit status, as `python3 -c` would give it; the
            # interpreter stays (a notebook's cell ends, the kernel lives on)
            error = "SystemExit"
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException as exc:  # noqa: BLE001 -- the interpreter stays
            error = type(exc).__name__
            tb = exc.__traceback__
            traceback.print_exception(type(exc), exc, tb.tb_next if tb else None)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            # a stream the code replaced or closed
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]  # None: suppressed as well
        send(b"D", {"ok": error is None, "error": error, "status": status})


if __name__ == "__main__":  # `python3 -c` runs it as __main__; importing runs nothing
    _main()
