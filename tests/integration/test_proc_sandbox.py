"""Proves from inside real sandboxes (bwrap and Landlock-only) what a process cannot do."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import sys
import textwrap
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import (
    AllowLists,
    Budget,
    CapabilityKind,
    DenyLists,
    ExecResult,
    FsCapability,
    Limits,
    Mappings,
    NetworkMode,
    ProcExecOp,
    Profile,
    ProfileCapability,
    ProfileDeny,
    RuleRef,
    SafetyClass,
    SideEffect,
)

pytestmark = pytest.mark.integration
PY = sys.executable
BACKENDS = ["bwrap", "landlock"]


def fs_cap(kind: str, *paths: str) -> ProfileCapability:
    return ProfileCapability(kind=CapabilityKind(kind),
                             all_of=(FsCapability(kind=kind, paths=paths),))  # type: ignore[arg-type]


def make_profile(root: Path, network: NetworkMode = NetworkMode.OFF, **limits: Any) -> Profile:
    rule = RuleRef(id="mandatory-secrets", file="system", line=1, column=1)
    denies = tuple(ProfileDeny(kinds=(CapabilityKind.FS_READ, CapabilityKind.FS_WRITE),
                               capability=FsCapability(kind="fs.read", paths=(p,)), rule=rule,
                               mandatory=True) for p in ("~/.ssh/**", "~/.aws/**", "**/.env"))
    return Profile(
        tenant="t", subject_id="agent:a", tool_name="runner", call_id="c1",
        capabilities=(fs_cap("fs.read", f"{root}/**"), fs_cap("fs.write", f"{root}/out/**")),
        denies=denies, safety=SafetyClass.HIGH, side_effects=(SideEffect.PROCESS,),
        limits=Limits(**limits), budget=Budget(), allow=AllowLists(), deny=DenyLists(),
        mappings=Mappings(root_fs=str(root), tmp_dir=str(root / "tmp"), home=str(root / "home")),
        network=network, timeout_ms=60_000, consent_required=False, expires_at=0,
        policy_name="p", policy_version="1", policy_version_hash="h", manifest_version="1",
    )


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    made = {b: ProcExecutor(b, ProcOptions(env_allow=("GIT_AUTHOR_NAME",))) for b in BACKENDS}
    for ex in made.values():
        assert ex.available() is True, ex.unavailable_reason  # bwrap and Landlock work here
    yield made
    for ex in made.values():
        ex.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "out").mkdir(parents=True)
    (r / "home" / ".ssh").mkdir(parents=True)
    (r / "home" / ".ssh" / "id_rsa").write_text("-----BEGIN FAKE KEY-----")
    (r / "proj").mkdir()
    (r / "proj" / ".env").write_text("TOKEN=fake-env-secret")
    (r / "in.txt").write_text("readable input")
    return r


def run(ex: ProcExecutor, root: Path, code: str, *, network: NetworkMode = NetworkMode.OFF,
        timeout: float = 60, argv_tail: tuple[str, ...] = (), **kw: Any) -> ExecResult:
    limits = {k: kw.pop(k) for k in list(kw) if k in Limits.model_fields}
    ctx = ExecContext(profile=make_profile(root, network, **limits),
                      deadline=time.monotonic() + timeout)
    return ex.execute(ctx, ProcExecOp(tool=PY, args=("-c", textwrap.dedent(code), *argv_tail),
                                      **kw))


def leftovers(marker: str) -> list[int]:
    """Host processes whose command line carries ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_environment_is_built_never_inherited(
        executors: dict[str, ProcExecutor], root: Path, backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AKIA-parent-secret")
    res = run(executors[backend], root, "import os, json; print(json.dumps(dict(os.environ)))",
              env={"GIT_AUTHOR_NAME": "agent"})
    assert "AKIA-parent-secret" not in res.out["stdout"]
    env = __import__("json").loads(res.out["stdout"])
    assert {"PATH", "LANG", "HOME", "TZ", "TMPDIR", "GIT_AUTHOR_NAME"} <= set(env)
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"] == str(root / "home")
    with pytest.raises(PolicyEngineError) as exc:
        run(executors[backend], root, "pass", env={"LD_PRELOAD": "/x.so"})
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_only_inside_writable_paths(executors: dict[str, ProcExecutor], root: Path,
                                           backend: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    res = run(executors[backend], root, f"""
        for path in [{str(root / 'out' / 'ok.txt')!r}, {str(root / 'in.txt')!r},
                     {str(root / 'new.txt')!r}, {str(outside)!r}, '/etc/pe-test', '/usr/pe-test']:
            try:
                with open(path, 'a') as fh:
                    fh.write('x')
                print('WROTE', path)
            except OSError as err:
                print('DENIED', path, err.errno)
    """)
    lines = res.out["stdout"].splitlines()
    assert lines[0] == f"WROTE {root / 'out' / 'ok.txt'}"
    # under bwrap, /tmp is a fresh tmpfs: a write "outside" lands there, never on the host
    assert all(line.startswith("DENIED") for line in lines[1:3] + lines[4:]), lines
    assert (root / "out" / "ok.txt").read_text() == "x"
    assert (root / "in.txt").read_text() == "readable input"
    assert not (root / "new.txt").exists()
    assert not outside.exists()
    assert not Path("/etc/pe-test").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_mandatory_denied_secrets_are_unreadable(executors: dict[str, ProcExecutor], root: Path,
                                                 backend: str) -> None:
    res = run(executors[backend], root, f"""
        for path in [{str(root / 'home/.ssh/id_rsa')!r}, {str(root / 'proj/.env')!r},
                     '/etc/shadow', {str(root / 'in.txt')!r}]:
            try:
                print('READ', path, repr(open(path).read()))
            except OSError as err:
                print('DENIED', path, err.errno)
    """)
    out = res.out["stdout"]
    assert "FAKE KEY" not in out
    assert "fake-env-secret" not in out
    assert "root:" not in out  # /etc/shadow content
    assert "'readable input'" in out  # the rest of the root stays readable
    assert str(root / "home/.ssh") in res.out["masked"] or backend == "landlock"


@pytest.mark.parametrize("backend", BACKENDS)
def test_network_off_cannot_reach_a_host_loopback_server(
        executors: dict[str, ProcExecutor], root: Path, backend: str) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[bool] = []

    def serve() -> None:
        server.settimeout(20)
        try:
            conn, _ = server.accept()
            accepted.append(True)
            conn.close()
        except OSError:
            pass

    code = f"""
        import socket
        try:
            socket.create_connection(('127.0.0.1', {port}), timeout=5).close()
            print('CONNECTED')
        except OSError as err:
            print('BLOCKED', err.errno)
    """
    try:
        off = run(executors[backend], root, code)
        assert off.out["stdout"].startswith("BLOCKED"), off.out
        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        on = run(executors[backend], root, code, network=NetworkMode.ON)
        thread.join(25)
        assert on.out["stdout"].startswith("CONNECTED"), on.out  # `on` really is on
        assert accepted == [True]
    finally:
        server.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_is_contained_by_the_pids_limit(executors: dict[str, ProcExecutor],
                                                  root: Path, backend: str) -> None:
    marker = f"pe-bomb-{uuid.uuid4().hex}"
    started = time.monotonic()
    res = run(executors[backend], root, """
        import os, sys, time
        ok = failed = 0
        for _ in range(500):
            try:
                if os.fork() == 0:
                    time.sleep(30)  # keeps the marker of the parent's argv
                    os._exit(0)
                ok += 1
            except OSError:
                failed += 1
        print(ok, failed)
    """, pids=32, argv_tail=(marker,))
    ok, failed = map(int, res.out["stdout"].split())
    assert ok < 32
    assert failed > 0
    assert "pids.max=32" in res.out["limits"]["pids"]
    assert time.monotonic() - started < 60
    assert leftovers(marker) == []  # nothing outlives the call


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_bomb_is_truncated_head_and_tail_with_bounded_memory(
        executors: dict[str, ProcExecutor], root: Path, backend: str) -> None:
    tracemalloc.start()
    try:
        res = run(executors[backend], root, """
            import sys
            out = sys.stdout.buffer
            out.write(b'HEAD')
            chunk = b'y' * 65536
            for _ in range(1600):
                out.write(chunk)
            out.write(b'TAIL')
            sys.stderr.write('e' * 10)
        """, max_stdout_bytes=64 * 1024, max_stderr_bytes=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.out["stdout_truncated"] is True
    assert res.out["stdout_bytes"] == 1600 * 65536 + 8
    assert res.out["stdout"].startswith("HEAD")
    assert res.out["stdout"].endswith("TAIL")
    assert len(res.out["stdout"]) == 64 * 1024
    assert res.out["stderr"] == "eeee"
    assert res.out["stderr_truncated"] is True
    assert peak < 8 * 1024 * 1024  # 100 MiB went through, a few chunks were ever held


@pytest.mark.parametrize("backend", BACKENDS)
def test_sleeper_is_killed_on_time_with_its_process_group(
        executors: dict[str, ProcExecutor], root: Path, backend: str) -> None:
    marker = f"pe-sleep-{uuid.uuid4().hex}"
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
    started = time.monotonic()
    with pytest.raises(PolicyEngineError) as exc:
        executors[backend].execute(ctx, ProcExecOp(
            tool=PY, args=("-c", "import os, time; os.fork(); os.fork(); time.sleep(60)", marker),
            timeout_ms=1000))
    elapsed = time.monotonic() - started
    assert exc.value.code == ErrorCode.TIMEOUT
    assert exc.value.code.value == "LLM.TIMEOUT"
    assert elapsed < 15
    assert leftovers(marker) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_seccomp_refuses_namespaces_mount_and_ptrace(executors: dict[str, ProcExecutor],
                                                     root: Path, backend: str) -> None:
    res = run(executors[backend], root, """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.unshare(0x10000000), ctypes.get_errno())        # CLONE_NEWUSER
        print(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
        print(libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
    """)
    assert res.out["stdout"].split() == ["-1", "1"] * 3, res.out
    assert res.out["isolation"]["seccomp"].startswith("enforced")
    assert res.out["isolation"]["landlock"].startswith("enforced")


@pytest.mark.parametrize("backend", BACKENDS)
def test_exit_code_stdin_and_usage_are_reported(executors: dict[str, ProcExecutor], root: Path,
                                                backend: str) -> None:
    import base64

    res = run(executors[backend], root,
              "import sys; d = sys.stdin.read(); print(d.upper()); sys.exit(3)",
              stdin_b64=base64.b64encode(b"hello").decode(), cwd=str(root / "proj"))
    assert res.out["exit_code"] == 3
    assert res.out["stdout"] == "HELLO\n"
    assert res.out["duration_ms"] > 0
    assert res.out["cpu_ms"] >= 0
    assert res.used.cpu_ms == res.out["cpu_ms"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cwd_outside_root_is_blocked(executors: dict[str, ProcExecutor], root: Path,
                                     backend: str) -> None:
    for cwd in ("/etc", str(root) + "-evil", str(root / "proj" / ".." / "..")):
        with pytest.raises(PolicyEngineError) as exc:
            run(executors[backend], root, "pass", cwd=cwd)
        assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED


@pytest.mark.parametrize("backend", BACKENDS)
def test_stdin_descriptor_is_closed_exactly_once(executors: dict[str, ProcExecutor], root: Path,
                                                 backend: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # pump closes the stdin descriptor it is given. If a file object still owned that number,
    # it would close it a second time when the Popen is released, hitting whatever reused the
    # number meanwhile. POSIX hands out the lowest free descriptor, so a pipe opened right
    # after pump returns takes the stdin number; it must survive the call.
    import plugins.executor_proc.executor as executor_module

    real_pump = executor_module.pump
    reused: list[int] = []
    given: list[int] = []

    def pump_then_reuse(*args: Any, **kwargs: Any) -> Any:
        outcome = real_pump(*args, **kwargs)
        given.append(args[4])
        fillers = []
        while True:  # take every lower free number so the next open gets the stdin one
            fd = os.open(os.devnull, os.O_RDONLY)
            if fd >= args[4]:
                reused.append(fd)
                break
            fillers.append(fd)
        for fd in fillers:
            os.close(fd)
        return outcome

    monkeypatch.setattr(executor_module, "pump", pump_then_reuse)
    for _attempt in range(5):
        # another thread of this process (the call's disk-write watchdog reads /proc files)
        # can take the freed number first: then this run proves nothing, so run again
        for fd in reused:
            with contextlib.suppress(OSError):
                os.close(fd)
        reused.clear()
        given.clear()
        result = run(executors[backend], root, "import sys; sys.stdin.read()",
                     stdin_b64=base64.b64encode(b"data").decode(), cwd=str(root / "proj"))
        assert result.out["exit_code"] == 0
        if reused == given:
            break
    assert reused == given  # the descriptor pump closed was taken again by our open
    try:
        for fd in reused:
            os.fstat(fd)  # EBADF here = the stdin number was closed twice
    finally:
        for fd in reused:
            with contextlib.suppress(OSError):
                os.close(fd)


def test_the_tool_holds_no_capabilities_and_evidence_says_who_dropped_them(
        executors: dict[str, ProcExecutor], root: Path) -> None:
    result = run(executors["bwrap"], root,
                 "print(''.join(l for l in open('/proc/self/status') if l.startswith('Cap')))")
    caps = {name: int(value, 16) for name, value in
            (line.split(":") for line in result.out["stdout"].split("\n") if line.strip())}
    assert set(caps) == {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
    assert all(v == 0 for v in caps.values()), caps
    assert result.out["isolation"]["caps"] == "dropped (bwrap --cap-drop ALL)"
