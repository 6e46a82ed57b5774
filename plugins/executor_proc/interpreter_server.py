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
"""

import contextlib
import io
import json
import linecache
import os
import struct
import sys
import traceback

_MAX_CODE = 16 << 20


def _main() -> None:
    proto = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)  # a print streams as it is made

    def send(tag: bytes, doc: dict[str, object]) -> None:
        payload = json.dumps(doc).encode()
        view = memoryview(tag + struct.pack(">I", len(payload)) + payload)
        while view:
            view = view[os.write(proto, view):]

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
    send(b"R", {"python": sys.version.split()[0]})
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
