"""Nagle's algorithm is off on every connection the engine's servers accept (issue 27 item 1).

Each server runs as a real process; the test holds a keep-alive connection to it, takes a copy
of the server's end with ``pidfd_getfd`` (Linux 5.6+, allowed on our own child processes) and
reads ``TCP_NODELAY`` from it: the socket option itself, not a timing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.mcp_fixtures import make_setup
from tests.integration.service_server import start

pytestmark = pytest.mark.integration

_SYS_PIDFD_GETFD = 438  # the same number on every Linux architecture
_libc = ctypes.CDLL(None, use_errno=True)


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                found.add(int(entry))
    return found


def _server_ends(pids: set[int]) -> Iterator[socket.socket]:
    """Copies of every socket the processes ``pids`` hold."""
    for pid in pids:
        pidfd = os.pidfd_open(pid)
        try:
            for name in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{name}")
                except FileNotFoundError:  # closed since the listing: not the one we look for
                    continue
                if not target.startswith("socket:"):
                    continue
                fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(name), 0)
                if fd < 0 and ctypes.get_errno() == errno.EBADF:
                    continue  # closed since its readlink
                assert fd >= 0, os.strerror(ctypes.get_errno())
                yield socket.socket(fileno=fd)
        finally:
            os.close(pidfd)


def _nodelay_of_server_end(pids: set[int], client: socket.socket) -> int:
    """TCP_NODELAY on the server's end of ``client``'s connection, held by one of ``pids``."""
    mine = client.getsockname()
    for sock in _server_ends(pids):
        with sock:
            if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
                continue
            try:
                peer = sock.getpeername()
            except OSError:  # the listener
                continue
            if peer == mine:
                return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    raise AssertionError(f"no process of {pids} holds the server end of {mine}")


def _keep_alive_request(url: str, path: str) -> socket.socket:
    """One HTTP/1.1 request on a raw connection left open; the connection."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    client = socket.create_connection((host, int(port)), timeout=10)
    client.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n\r\n"
                   .encode())
    assert client.recv(65536).startswith(b"HTTP/1.1 ")
    return client


def test_serve_turns_nagle_off_on_each_connection(tmp_path: Path) -> None:
    with start(tmp_path) as svc:
        for _ in range(2):  # not only the first connection
            with _keep_alive_request(svc.url, "/sandbox/health") as client:
                assert _nodelay_of_server_end({svc.proc.pid}, client) == 1


def test_the_metrics_listener_turns_nagle_off(tmp_path: Path) -> None:
    with start(tmp_path, "--metrics-port", "0") as svc:
        log = svc.root / "serve.log"
        deadline = time.monotonic() + 30
        while "/metrics" not in (text := log.read_text()):
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        url = text.split("metrics on ")[1].split()[0].removesuffix("/metrics")
        host, port = url.removeprefix("http://").split(":")
        # an HTTP/1.0 server closes after one answer: the connection is looked at while its
        # request is still being read (the accepted socket is the one that answers)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(b"GET /metrics HTTP/1.1\r\n")
            time.sleep(0.2)
            assert _nodelay_of_server_end({svc.proc.pid}, client) == 1


def test_serve_workers_turn_nagle_off_in_every_worker(tmp_path: Path) -> None:
    with start(tmp_path, "--workers", "2") as svc:
        deadline = time.monotonic() + 30
        while len(workers := _children(svc.proc.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        opened = [_keep_alive_request(svc.url, "/sandbox/health") for _ in range(8)]
        try:
            for client in opened:  # whichever worker accepted it
                assert _nodelay_of_server_end(workers, client) == 1
        finally:
            for client in opened:
                client.close()


def test_mcp_http_turns_nagle_off_on_each_connection(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    log = tmp_path / "mcp.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, *setup.mcp_args("--transport", "http",
                                                                 "--port", "0")],
                                stdout=subprocess.DEVNULL, stderr=sink, env=setup.env())
    try:
        deadline = time.monotonic() + 30
        while "listening on http://" not in (text := log.read_text()):
            assert proc.poll() is None, text
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        url = text.split("listening on ")[1].split()[0]
        while True:
            try:
                client = _keep_alive_request(url, "/mcp")
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        with client:
            assert _nodelay_of_server_end({proc.pid}, client) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_netproxy_bridge_turns_nagle_off(tmp_path: Path) -> None:
    bridge = Path(__file__).parents[2] / "policy_engine" / "netproxy" / "bridge.py"
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    upstream.bind(str(tmp_path / "proxy.sock"))
    upstream.listen()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen([sys.executable, "-I", str(bridge), "--listen", f"127.0.0.1:{port}",
                             "--unix", str(tmp_path / "proxy.sock"), "--", "sleep", "30"])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with client:
            upstream.settimeout(10)
            relayed, _ = upstream.accept()  # the bridge has accepted and dialled the proxy
            relayed.close()
            assert _nodelay_of_server_end({proc.pid}, client) == 1
    finally:
        proc.kill()
        proc.wait()
        upstream.close()
