"""proc-bwrap's pid namespace ends with the tool: nothing the tool leaves behind outlives the
call (not even without cgroups, out of its process group), the tool cannot kill the namespace's
init, and a signal ending the tool is told apart from an exit code (the native launcher's ``-W``
pidfd, or its ``-w`` report where that cannot be sent). Run for real, in the sandbox; they
hold whichever process is the namespace's pid 1 (bwrap's reaper: ``bwrap --as-pid-1`` with the
launcher as init was measured, no faster).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc import native, pidfd_exit, status_pipe
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from tests.integration.test_proc_sandbox import leftovers, run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    made = {"default": ProcExecutor("bwrap"),
            # no cgroup to kill what is left: only the pid namespace ends it
            "no-cgroups": ProcExecutor("bwrap", ProcOptions(cgroups=False))}
    for ex in made.values():
        assert ex.available() is True, ex.unavailable_reason
    yield made
    for ex in made.values():
        ex.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "out").mkdir(parents=True)
    return r


@pytest.mark.parametrize("which", ["default", "no-cgroups"])
def test_an_orphan_in_its_own_process_group_dies_when_the_tool_exits(
        executors: dict[str, ProcExecutor], root: Path, which: str) -> None:
    tag = uuid.uuid4().hex
    res = run(executors[which], root, f"""
        import os, sys
        if os.fork() == 0:
            if os.fork() == 0:
                os.setpgid(0, 0)  # out of the call's process group: killpg misses it
                os.execv(sys.executable, [sys.executable, "-c",
                         "import time; time.sleep(60)  # orphan-{tag}"])
            os._exit(0)
        os.wait()
        import time; time.sleep(0.3)  # the orphan has exec'd
        print("left")
    """)
    assert res.out["exit_code"] == 0, res.out
    assert res.out["stdout"] == "left\n"
    deadline = time.monotonic() + 5
    while leftovers(f"orphan-{tag}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers(f"orphan-{tag}") == [], "a process of the call outlived it"


def test_the_tool_cannot_kill_its_init(executors: dict[str, ProcExecutor], root: Path) -> None:
    res = run(executors["default"], root, """
        import os, signal, time
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT):
            try:  # refused (Landlock's signal scope: pid 1 is outside the domain) or ignored
                os.kill(1, sig)
            except PermissionError:
                pass
        time.sleep(0.2)
        print("still here")
        raise SystemExit(5)
    """)
    assert res.out["exit_code"] == 5, res.out
    assert res.out["stdout"] == "still here\n"
    assert "signal" not in res.out


@pytest.mark.parametrize("sig", [9, 15])
def test_a_signal_ending_the_tool_is_reported_as_one(executors: dict[str, ProcExecutor],
                                                     root: Path, sig: int) -> None:
    res = run(executors["default"], root, f"import os; os.kill(os.getpid(), {sig})")
    assert res.out["exit_code"] == 128 + sig, res.out
    assert res.out["signal"] == sig
    exited = run(executors["default"], root, f"raise SystemExit({128 + sig})")
    assert exited.out["exit_code"] == 128 + sig
    assert "signal" not in exited.out  # the same code, exited on its own


def test_the_tool_is_execd_in_place_by_its_launcher(executors: dict[str, ProcExecutor],
                                                     root: Path) -> None:
    """``-W``: no launcher process stays between bwrap's init and the tool (issue 27 item 4):
    the tool is the namespace's pid 2, its parent pid 1; the end is still told apart above."""
    assert pidfd_exit.supported(), "this kernel keeps no exit status for pidfds (Linux 6.15)"
    res = run(executors["default"], root, "import os; print(os.getpid(), os.getppid())")
    assert res.out["exit_code"] == 0, res.out
    assert res.out["stdout"].split() == ["2", "1"]
    assert res.out["isolation"]["landlock"].startswith("enforced")
    assert res.out["isolation"]["seccomp"].startswith("enforced")


def _launch(args: list[str], end_fd: int) -> tuple[bytes, int]:
    """The native launcher on the host (no bwrap) with ``-W end_fd``: its status and its exit
    code; ``end_fd`` is closed here once handed over."""
    exe = native.launcher().path
    assert exe is not None, native.launcher().reason
    status_r, status_w = os.pipe()
    proc = subprocess.Popen([exe, "-s", str(status_w), "-W", str(end_fd), *args],
                            pass_fds=(status_w, end_fd), stdin=subprocess.DEVNULL)
    os.close(status_w)
    os.close(end_fd)
    proc.wait(30)
    with os.fdopen(status_r, "rb") as fh:
        return fh.read(), proc.returncode


@pytest.mark.parametrize(("script", "expected"), [("exit 3", {"exit": 3}),
                                                  ("exit 137", {"exit": 137}),
                                                  ("kill -9 $$", {"signal": 9})])
def test_the_pidfd_the_launcher_sends_says_how_the_tool_ended(
        script: str, expected: dict[str, int]) -> None:
    ours, theirs = socket.socketpair()
    status, _ = _launch(["--", "/bin/sh", "-c", script], theirs.detach())
    with ours:
        ended = pidfd_exit.receive(ours)
    assert ended is not None, status
    assert pidfd_exit.tool_end(ended) == expected
    assert b"tool_end" not in status  # exec'd in place: no parent left to report
    assert json.loads(status)["launcher"] == "native"


def test_a_launcher_that_cannot_send_the_pidfd_forks_and_reports_as_before() -> None:
    """``-W`` on something that is no socket: the pidfd cannot be sent, so the launcher falls
    back to ``-w`` (fork the tool, report its end on the status pipe)."""
    pipe_r, pipe_w = os.pipe()
    try:
        status, code = _launch(["--", "/bin/sh", "-c", "kill -15 $$"], pipe_w)
    finally:
        os.close(pipe_r)
    assert code == 128 + 15
    assert status_pipe.parse(status)["tool_end"] == {"signal": 15}
