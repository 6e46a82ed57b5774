"""Second-pass findings N2 and N1, run for real on every proc backend: a root-owned host Unix
listener in a bound tree is unreachable with network off, and ``fallocate`` cannot preallocate
past the per-file cap (issue 32, items 1 and 2)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_local.executor import LocalExecutor
from plugins.executor_proc import seccomp
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.executor import ExecContext
from policy_engine.model import NetHttpCapability, NetworkMode, ProcExecOp, Profile
from tests.integration.planted import planted_world
from tests.integration.servers import LoopbackServer, compiled_profile
from tests.integration.test_proc_sandbox import fs_cap, make_profile

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"
CAP = 1 << 20  # the per-file cap the tests give (max_file_bytes)
BACKENDS = ["bwrap", "bwrap-python", "landlock", "unshare", "local"]
PROBE = textwrap.dedent("""
    import socket, sys
    path = sys.argv[1]
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        try:
            s = socket.socket(socket.AF_UNIX, kind); s.settimeout(3); s.connect(path)
            s.sendall(b"probe"); print("CONNECTED", kind, s.recv(40))
        except OSError as e:
            print("blocked", kind, e.errno)
    a, b = socket.socketpair()  # a connected pair reaches nothing else: stays usable
    a.sendall(b"pair"); print("pair", b.recv(4).decode())
""")
FALLOC = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    path, size = sys.argv[1], int(sys.argv[2])
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    for mode in (1, 0x10, 0x11, 0x20, 0x4):  # KEEP_SIZE, ZERO_RANGE(+KEEP_SIZE), INSERT, NO_HIDE
        rc = libc.fallocate(fd, mode, 0, size)
        print("mode", mode, rc, ctypes.get_errno() if rc else 0)
    rc = libc.fallocate(fd, 0, 0, 4096)  # plain mode, within the cap: allowed
    print("plain", rc)
    rc = libc.fallocate(fd, 3, 0, 4096)  # punching a hole frees space: allowed
    print("punch", rc)
    st = os.fstat(fd)
    print("allocated", st.st_blocks * 512, "size", st.st_size)
    # extended attributes: disk blocks no write quota counts (attack 36), refused as a file
    # system without them refuses them; reading and listing stay
    for name, args, kw in (("setxattr", (path,), {}), ("fsetxattr", (fd,), {}),
                           ("lsetxattr", (path,), {"follow_symlinks": False})):
        try:
            os.setxattr(*args, "user.a", b"x" * 4000, **kw)
            print(name, "set")
        except OSError as e:
            print(name, "errno", e.errno)
    print("listxattr", os.listxattr(path))
""")


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    small = ProcOptions(max_file_bytes=CAP)
    made: dict[str, ProcExecutor] = {
        "bwrap": ProcExecutor("bwrap", small), "landlock": ProcExecutor("landlock", small),
        "bwrap-python": ProcExecutor("bwrap", ProcOptions(launcher="python",
                                                          max_file_bytes=CAP)),
        "unshare": ProcExecutor("unshare", small), "local": LocalExecutor(small)}
    for name, ex in made.items():
        assert ex.available() is True, (name, ex.unavailable_reason)
    yield made
    for ex in made.values():
        ex.close()


@pytest.fixture
def world() -> Iterator[Path]:
    with planted_world("pe-hostipc-") as r:
        (r / "work").mkdir(mode=0o777)
        # the sandbox uid's, as an earlier call leaves it: a root-owned tree would be id-mapped,
        # which the Python launcher cannot carry (refused in strict mode, issue 26)
        for tree in (r / "work", r / "out"):
            os.chown(tree, 65533, 65533)
        yield r


@contextlib.contextmanager
def host_listener(path: Path) -> Iterator[list[bytes]]:
    """A root process listening on a world-connectable socket file (stream and datagram)."""
    got: list[bytes] = []
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o777)
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                got.append(conn.recv(20))
                conn.sendall(b"HOST-UNIX-HELLO\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield got
    finally:
        stop.set()
        t.join(2)
        srv.close()
        path.unlink(missing_ok=True)


def _run(ex: ProcExecutor, profile: Profile, code: str, *args: str) -> dict[str, object]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    return ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", code, *args))).out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_host_unix_listener_in_a_bound_tree_is_unreachable_with_network_off(
        executors: dict[str, ProcExecutor], world: Path, backend: str) -> None:
    sock = world / "work" / "host.sock"
    with host_listener(sock) as got:
        with socket.socket(socket.AF_UNIX) as s:  # the listener is real: the host reaches it
            s.connect(str(sock))
            s.sendall(b"host")
            assert s.recv(20) == b"HOST-UNIX-HELLO\n"
        out = _run(executors[backend], make_profile(world), PROBE, str(sock))
    assert out["exit_code"] == 0, out["stderr"]
    stdout = str(out["stdout"])
    assert "CONNECTED" not in stdout, stdout
    assert stdout.count("blocked") == 2, stdout
    assert "pair pair" in stdout, stdout
    assert got == [b"host"], got  # only the host's own connection arrived


def test_a_host_unix_listener_behind_a_read_only_bind_is_unreachable(
        executors: dict[str, ProcExecutor], world: Path) -> None:
    """The report's second form: the socket lies in a tree bound read-only."""
    sock = world / "host.sock"  # readable (`root/**`), not writable (only `out/**`)
    with host_listener(sock) as got:
        out = _run(executors["bwrap"], make_profile(world), PROBE, str(sock))
    assert out["exit_code"] == 0, out["stderr"]
    assert "CONNECTED" not in str(out["stdout"]), out["stdout"]
    assert got == []


def test_network_on_keeps_unix_sockets(executors: dict[str, ProcExecutor], world: Path) -> None:
    """The refusal is network off's: a profile with the host network keeps AF_UNIX (so the
    probe above fails for the refusal, not for a broken socket)."""
    sock = world / "work" / "host.sock"
    with host_listener(sock) as got:
        out = _run(executors["bwrap"], make_profile(world, NetworkMode.ON), PROBE, str(sock))
    assert "CONNECTED" in str(out["stdout"]), out
    assert got == [b"probe"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fallocate_cannot_preallocate_past_the_file_cap(
        executors: dict[str, ProcExecutor], world: Path, backend: str) -> None:
    """N1: FALLOC_FL_KEEP_SIZE allocated 3 GiB past a 1 GiB RLIMIT_FSIZE. Here the cap is
    1 MiB and the attempt 64 MiB (the disk is shared): every preallocating mode is refused
    with EOPNOTSUPP, the plain mode stays bounded by the cap, punching a hole works."""
    ex = executors[backend]
    target = world / "out" / "fa.bin"
    try:
        out = _run(ex, make_profile(world), FALLOC, str(target), str(64 << 20))
    finally:
        allocated = os.stat(target).st_blocks * 512 if target.exists() else 0
        target.unlink(missing_ok=True)
    stdout = str(out["stdout"])
    assert out["exit_code"] == 0, out["stderr"]
    for mode in (1, 0x10, 0x11, 0x20, 0x4):
        assert f"mode {mode} -1 95" in stdout, stdout  # EOPNOTSUPP
    assert "plain 0" in stdout, stdout
    assert "punch 0" in stdout, stdout
    assert allocated <= CAP, (allocated, stdout)
    for name in ("setxattr", "fsetxattr", "lsetxattr"):
        assert f"{name} errno 95" in stdout, stdout  # EOPNOTSUPP
    assert "listxattr []" in stdout, stdout
    # the file system itself takes user attributes: the refusal is the filter's
    probe = world / "out" / "xattr-probe"
    probe.touch()
    os.setxattr(probe, "user.a", b"x" * 4000)
    probe.unlink()


def test_the_filter_refuses_exactly_the_preallocating_modes() -> None:
    """The rule as data: modes 0 and KEEP_SIZE|PUNCH_HOLE only (the integration test above
    runs it)."""
    assert seccomp.FALLOCATE_MODES_OK == (0x0, 0x3)
    prog = seccomp.build_filter(deny_inet=True, deny_setsid=False)
    assert len(prog) % 8 == 0


def test_sandbox_exec_with_allow_read_outside_reaches_no_host_listener(tmp_path: Path) -> None:
    """The report's `sandbox exec` form: `allowReadOutside: true` binds `/` read-only, the
    listener lies outside the whitelist; through the CLI, as a user runs it."""
    home = tmp_path / "home"
    proj = home / "proj"
    proj.mkdir(parents=True)
    (tmp_path / "sandbox.json").write_text(json.dumps({
        "enabled": True, "network": {"allowNetwork": False},
        "filesystem": {"whitelist": [], "blacklist": [], "allowReadOutside": True}}))
    outside = Path(tempfile.mkdtemp(prefix="pe-hostipc-", dir="/var/tmp"))  # /tmp is private
    outside.chmod(0o755)
    env = {**os.environ, "HOME": str(home),
           "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")}
    try:
        with host_listener(outside / "host.sock") as got:
            ran = subprocess.run(
                [sys.executable, "-m", "policy_engine.cli", "sandbox", "exec", "--config",
                 str(tmp_path / "sandbox.json"), "--state-dir", str(tmp_path / "st"), "--cwd",
                 str(proj), "--", PYTHON, "-c", PROBE, str(outside / "host.sock")],
                capture_output=True, text=True, timeout=120, check=False, env=env)
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "CONNECTED" not in ran.stdout, ran.stdout
    assert ran.stdout.count("blocked") == 2, ran.stdout
    assert got == []


def test_restricted_network_tool_reaches_no_host_listener(world: Path) -> None:
    """Network restricted to the policy proxy: the bridge speaks AF_UNIX to the proxy, the
    tool's own layer refuses AF_UNIX, so a host listener in a bound tree stays unreachable
    (and the proxy's socket is reached through the bridge only)."""
    with LoopbackServer({}) as srv:
        cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(srv.port,),
                                methods=("GET",))
        profile, guard = compiled_profile(
            world, 'permit "p" net.http hosts ["127.0.0.1"] schemes ["http"] '
            f'ports [{srv.port}] methods ["GET"]', (cap,), network="restricted")
    profile = profile.model_copy(update={"capabilities": (
        *profile.capabilities, fs_cap("fs.read", f"{world}/**")),
        "mappings": make_profile(world).mappings})
    ex = ProcExecutor("bwrap")
    sock = world / "work" / "host.sock"
    try:
        with host_listener(sock) as got:
            ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60, guard=guard)
            out = ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", PROBE, str(sock)))).out
    finally:
        ex.close()
    assert out["exit_code"] == 0, out["stderr"]
    assert "CONNECTED" not in str(out["stdout"]), out["stdout"]
    assert str(out["stdout"]).count("blocked") == 2, out["stdout"]
    assert got == []
