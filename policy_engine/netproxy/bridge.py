"""In-namespace bridge: listens on 127.0.0.1:PORT inside the sandbox, forwards to the proxy socket.

Runs as the sandbox's first process (standard library only: the project is not mounted inside),
then starts the real command and exits with its status. Usage::

    python3 -I bridge.py --listen 127.0.0.1:3128 --unix /run/policy-engine-net/proxy.sock \
        [--pass-fd N] -- argv…

``--pass-fd`` hands descriptor N to the command and closes it here (the proc executor's status
pipe, which the launcher before the tool writes to).

Inside a network namespace with no interface but ``lo`` this is the only way out, and it only
leads to the host-side policy proxy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

BUFSIZE = 65536
IDLE_SECONDS = 300.0


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(BUFSIZE)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket, unix_path: str) -> None:
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.settimeout(IDLE_SECONDS)
        upstream.connect(unix_path)
    except OSError:
        client.close()
        return
    client.settimeout(IDLE_SECONDS)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join(IDLE_SECONDS)
    upstream.close()
    client.close()


def _serve(listener: socket.socket, unix_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        # Nagle off: a small request would otherwise wait for the delayed ACK (~40 ms)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_relay, args=(client, unix_path), daemon=True).start()


def _listen(spec: str) -> socket.socket:
    host, _, port = spec.rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # copied to each accept
    listener.bind((host, int(port)))
    listener.listen(64)
    return listener


def main(argv: list[str]) -> int:
    """Parse ``--listen``, ``--unix``, ``--`` then the command; return the command's status."""
    try:
        sep = argv.index("--")
        opts = dict(zip(argv[:sep:2], argv[1:sep:2], strict=True))
        listen, unix_path, command = opts["--listen"], opts["--unix"], argv[sep + 1:]
    except (ValueError, KeyError):
        sys.stderr.write("bridge: usage: --listen HOST:PORT --unix PATH -- COMMAND...\n")
        return 125
    if not command:
        sys.stderr.write("bridge: no command\n")
        return 125
    try:
        listener = _listen(listen)
    except OSError as exc:
        sys.stderr.write(f"bridge: cannot listen on {listen}: {exc.strerror}\n")
        return 125
    passed = tuple(int(fd) for fd in opts.get("--pass-fd", "").split(",") if fd)
    threading.Thread(target=_serve, args=(listener, unix_path), daemon=True).start()
    try:
        child = subprocess.Popen(command, pass_fds=passed)
    except OSError as exc:
        sys.stderr.write(f"bridge: cannot run {command[0]}: {exc.strerror}\n")
        return 127
    finally:
        for fd in passed:
            with contextlib.suppress(OSError):
                os.close(fd)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = child.wait()
    listener.close()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
