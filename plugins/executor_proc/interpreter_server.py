"""The long-lived Python interpreter a stateful session runs inside its sandbox (stdlib only).

Started as ``python3 -c <this file>`` under the session's bubblewrap plan; it talks to the engine
over its own stdin and stdout, in frames of one type byte and a 4-byte big-endian length:
engine → interpreter ``C`` (the code of one call, UTF-8); interpreter → engine ``R`` (ready,
once), ``O``/``E`` (the call's stdout/stderr bytes, at most 64 KiB a frame) and ``D`` (the call
ended: JSON ``{"ok": bool, "error": name | null}``). The code's own fd 1 and 2 are pipes this
process drains, so a child it spawns (``os.system``) is captured as well; its stdin is
``/dev/null``. Everything here belongs to the caller (the code can read or forge frames): the
engine bounds every frame and trusts them for nothing but the call's own output.
"""

import json
import os
import select
import struct
import sys
import threading
import traceback

_CHUNK = 64 * 1024
_MAX_CODE = 16 << 20


def _main() -> None:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    pipes = {}
    for fd, tag in ((1, b"O"), (2, b"E")):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        os.set_blocking(r, False)
        pipes[r] = tag
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace",
                      closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace",
                      closefd=False)
    lock = threading.Lock()

    def send(tag: bytes, payload: bytes) -> None:
        os.write(proto_out, tag + struct.pack(">I", len(payload)))
        view = memoryview(payload)
        while view:
            view = view[os.write(proto_out, view):]

    def drain() -> None:
        # called with the lock held: whatever sits in the pipes now goes out, in order
        for fd, tag in pipes.items():
            while True:
                try:
                    data = os.read(fd, _CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    break
                send(tag, data)

    def pump() -> None:
        while True:
            select.select(list(pipes), [], [])
            with lock:
                drain()

    threading.Thread(target=pump, name="interpreter-output", daemon=True).start()

    def read_exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            part = os.read(proto_in, n - len(buf))
            if not part:
                os._exit(0)  # the engine closed the channel: the session ended
            buf += part
        return bytes(buf)

    names = {"__name__": "__main__", "__builtins__": __builtins__}
    with lock:
        send(b"R", json.dumps({"python": sys.version.split()[0], "pid": os.getpid()}).encode())
    while True:
        tag, size = struct.unpack(">cI", read_exact(5))
        if tag != b"C" or size > _MAX_CODE:
            os._exit(70)  # not the engine's frame: nothing is run
        code = read_exact(size).decode("utf-8", "replace")
        error = None
        try:
            exec(compile(code, "<cell>", "exec"), names)  # noqa: S102 -- its purpose
        except BaseException as exc:  # noqa: BLE001 -- SystemExit too: the interpreter stays
            error = type(exc).__name__
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 -- a stream the code replaced or closed
                pass
        with lock:
            drain()
            send(b"D", json.dumps({"ok": error is None, "error": error}).encode())


if __name__ == "__main__":  # `python3 -c` runs it as __main__; importing runs nothing
    _main()
