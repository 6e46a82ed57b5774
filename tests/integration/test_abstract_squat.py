"""Attack32 L6, run for real: a sandbox with network off must not take an abstract Unix socket
name from the host. proc-landlock and local share the host's network namespace, where abstract
names live; binding one on the stream socketpair they keep made a host service's bind of the
same name fail with EADDRINUSE while the call ran. proc-bwrap and proc-unshare have their own
namespace (checked too: the host's bind works there as well)."""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_local.executor import LocalExecutor
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.planted import planted_world
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"
HOST_NETNS = ["landlock", "local"]  # the backends in the host's network namespace
# binds the name on a socketpair end (and autobinds, and a plain bind), says so in a file, then
# holds everything until the host has tried the same name
SQUAT = textwrap.dedent("""
    import os, socket, sys, time
    name, out = sys.argv[1].encode(), sys.argv[2]
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for what, addr in (("named", b"\\0" + name), ("autobind", b"")):
        try:
            a.bind(addr); print(what, "BOUND", a.getsockname(), flush=True)
        except OSError as e:
            print(what, "refused", e.errno, flush=True)
    a.sendall(b"pair"); print("pair", b.recv(4).decode())
    try:  # a host port: the local runner keeps the host's network, the profile says off
        t = socket.socket(); t.bind(("127.0.0.1", 0)); print("tcp BOUND", t.getsockname())
    except OSError as e:
        print("tcp refused", e.errno, flush=True)
    open(out + "/attempted", "w").close()
    deadline = time.monotonic() + 20
    while not os.path.exists(out + "/done") and time.monotonic() < deadline:
        time.sleep(0.05)
""")


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    made: dict[str, ProcExecutor] = {
        "bwrap": ProcExecutor("bwrap", ProcOptions()), "landlock": ProcExecutor("landlock"),
        "unshare": ProcExecutor("unshare"), "local": LocalExecutor(ProcOptions())}
    for name, ex in made.items():
        assert ex.available() is True, (name, ex.unavailable_reason)
    yield made
    for ex in made.values():
        ex.close()


@pytest.fixture
def world() -> Iterator[Path]:
    with planted_world("pe-squat-") as r:
        (r / "out").mkdir(mode=0o777, exist_ok=True)
        yield r


def _host_bind(name: bytes) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.bind(b"\0" + name)
        except OSError as exc:
            return f"EADDRINUSE: {exc}"
        return "bound"


@pytest.mark.parametrize("backend", ["landlock", "local", "bwrap", "unshare"])
def test_a_sandbox_cannot_squat_a_host_abstract_socket_name(
        executors: dict[str, ProcExecutor], world: Path, backend: str) -> None:
    name = f"pe-squat-{os.getpid()}-{backend}"
    assert _host_bind(name.encode()) == "bound"  # free before the call
    out = world / "out"
    result: dict[str, object] = {}

    def call() -> None:
        ctx = ExecContext(profile=make_profile(world), deadline=time.monotonic() + 60)
        result.update(executors[backend].execute(
            ctx, ProcExecOp(tool=PYTHON, args=("-c", SQUAT, name, str(out)))).out)

    runner = threading.Thread(target=call)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while not (out / "attempted").exists():
            # the call ended before its attempt: say how (exit code and stderr, not cut)
            assert runner.is_alive(), (result.get("exit_code"), result.get("stderr"))
            assert time.monotonic() < deadline, "the sandbox never tried"
            time.sleep(0.05)
        during = _host_bind(name.encode())  # while the call still runs, holding its sockets
    finally:
        (out / "done").touch()
        runner.join(60)
    stdout = str(result.get("stdout"))
    assert result.get("exit_code") == 0, result.get("stderr")
    assert during == "bound", f"{backend}: the host's bind failed during the call: {stdout}"
    assert "pair pair" in stdout, stdout  # the socketpair itself still works
    if backend in HOST_NETNS:
        assert "named refused" in stdout, stdout
        assert "autobind refused" in stdout, stdout
        assert "tcp refused" in stdout, stdout
