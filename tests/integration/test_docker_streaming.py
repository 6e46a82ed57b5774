"""Docker execs stream stdout/stderr while they run (issue 28 item 4), as proc-bwrap does: the
executor's ``on_output`` hook sees each chunk as the process writes it on every Docker path —
a warm container's launcher, a ``docker exec`` in a warm container, a run-once container —
in order, before capping, and the final record is unchanged; a docker session's exec streams
its chunks (the hook the SSE stream and MCP progress read) while it runs, capped per stream
exactly as on proc-bwrap.

Before: the docker executor declared ``streaming_output`` but called no hook, so a docker
exec's output came only in its final result."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.executor import ExecContext
from policy_engine.gateway.session_execs import SessionExecs
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.model import ProcExecOp
from tests.integration.test_docker_pool import make_profile
from tests.integration.test_docker_sessions import rt  # noqa: F401 -- the fixture

pytestmark = pytest.mark.integration

# stdout, then stderr, then a pause, then stdout again: each flushed as written
TALK = ("import sys, time\n"
        "print('first-marker', flush=True)\n"
        "time.sleep(0.3)\n"
        "sys.stderr.write('err-marker\\n'); sys.stderr.flush()\n"
        "time.sleep(2)\n"
        "print('second-marker', flush=True)\n")


@pytest.fixture(params=["launcher", "docker-exec", "run-once"])
def executor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DockerExecutor]:
    mode = "run-once" if request.param == "run-once" else "pool"
    ex = DockerExecutor(DockerOptions(mode=mode, pool_size=1, workspace_root=str(tmp_path),
                                      pool_launcher=request.param == "launcher"))
    yield ex
    ex.close()


def _streamed(ex: DockerExecutor, tmp_path: Path, code: str, **limits: Any
              ) -> tuple[list[tuple[float, str, bytes]], dict[str, Any], float]:
    """Run ``code``; what the hook saw (monotonic time, stream, bytes), the result, and the
    time the call returned."""
    seen: list[tuple[float, str, bytes]] = []
    ctx = ExecContext(profile=make_profile(tmp_path, **limits),
                      deadline=time.monotonic() + 90,
                      on_output=lambda stream, data: seen.append((time.monotonic(), stream,
                                                                 data)))
    out = ex.execute(ctx, ProcExecOp(tool="python3", args=("-c", code))).out
    return seen, out, time.monotonic()


def test_every_docker_path_streams_while_the_process_runs(executor: DockerExecutor,
                                                          tmp_path: Path) -> None:
    seen, out, ended = _streamed(executor, tmp_path, TALK)
    assert out["exit_code"] == 0, out
    firsts = [t for t, s, d in seen if s == "stdout" and b"first-marker" in d]
    assert firsts, seen
    first = firsts[0]
    assert first < ended - 1.5, (first, ended)  # while it slept, not at the end
    # order kept across the two streams; the streamed bytes are the record's
    markers = [m for _, _, d in seen for m in (b"first-marker", b"err-marker",
                                               b"second-marker") if m in d]
    assert markers == [b"first-marker", b"err-marker", b"second-marker"]
    assert b"".join(d for _, s, d in seen if s == "stdout").decode() == out["stdout"]
    assert b"".join(d for _, s, d in seen if s == "stderr").decode() == out["stderr"]
    assert out["stdout"] == "first-marker\nsecond-marker\n"


def test_the_hook_sees_every_byte_before_the_records_cap(executor: DockerExecutor,
                                                         tmp_path: Path) -> None:
    """As on proc-bwrap (plugins/executor_proc/output.py): the hook sees each chunk before the
    capture cap; the record keeps its head and tail and says it was truncated."""
    seen, out, _ = _streamed(executor, tmp_path,
                             "import sys\nsys.stdout.write('x' * 200_000)",
                             max_stdout_bytes=1000)
    assert out["stdout_truncated"] is True, out
    assert out["stdout_bytes"] == 200_000
    assert len(out["stdout"]) < 2000  # its head and tail, with a note of what was dropped
    assert sum(len(d) for _, s, d in seen if s == "stdout") == 200_000


def test_a_docker_session_exec_streams_its_chunks_while_it_runs(rt: Sessions) -> None:  # noqa: F811
    execs = SessionExecs(rt)
    s = rt.create("acme", "alice", backend="docker")
    job = execs.start("acme", "alice", s.session_id, TALK, timeout=60, wait=False)
    seen: list[tuple[float, str, str]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        had = len(seen)
        with job.changed:
            job.changed.wait_for(lambda had=had: job.done or len(job.chunks) > had, timeout=1)
            fresh, done = job.chunks[had:], job.done
        seen += [(time.monotonic(), c.stream, c.text) for c in fresh]
        if done:
            break
    ended = time.monotonic()
    assert job.status == "completed", job.to_json()
    assert job.result is not None
    # a refused or failed run streams nothing: say why rather than "no chunks"
    assert job.result.success, job.to_json()
    firsts = [t for t, s_, text in seen if s_ == "stdout" and "first-marker" in text]
    assert firsts, seen
    first = firsts[0]
    assert first < ended - 1.5, (first, ended)
    assert [s_ for _, s_, _ in seen if s_ == "stderr"] == ["stderr"]
    assert "".join(text for _, s_, text in seen if s_ == "stdout") == job.result.stdout
    assert [c.seq for c in job.chunks] == list(range(len(job.chunks)))


@pytest.mark.parametrize("backend", ["proc-bwrap", "docker"])
def test_the_stream_cap_is_the_same_on_both_backends(rt: Sessions, backend: str  # noqa: F811
                                                     ) -> None:
    """Each stream is capped at ``max_stream_bytes`` (then ``truncated``); the final record
    keeps its own capture cap, whatever the backend."""
    execs = SessionExecs(rt, max_stream_bytes=1000)
    s = rt.create("acme", "alice", backend=backend, security_mode="permissive")
    job = execs.start("acme", "alice", s.session_id,
                      "for i in range(500):\n    print('%09d' % i)", timeout=60)
    assert job.status == "completed", job.to_json()
    assert job.result is not None
    assert job.result.success, job.to_json()
    streamed = "".join(c.text for c in job.chunks if c.stream == "stdout")
    assert streamed == job.result.stdout[:1000]
    assert job.truncated == {"stdout": True, "stderr": False}
    assert len(job.result.stdout) == 5000


def test_a_cancelled_docker_exec_streams_until_its_end_and_no_further(
        rt: Sessions) -> None:  # noqa: F811
    """Cancelled once its first line streamed: the exec ends ``cancelled`` and its stream
    holds what the process wrote until the kill; nothing is appended after the end."""
    execs = SessionExecs(rt)
    s = rt.create("acme", "alice", backend="docker")
    job = execs.start("acme", "alice", s.session_id,
                      "import time\nprint('begun', flush=True)\ntime.sleep(40)",
                      timeout=50, wait=False)
    with job.changed:
        assert job.changed.wait_for(lambda: bool(job.chunks), timeout=30), job.to_json()
    assert job.status == "running"
    t0 = time.monotonic()
    execs.cancel("acme", "alice", s.session_id, job.exec_id)
    assert time.monotonic() - t0 < 10
    assert job.status == "cancelled", job.to_json()
    assert job.result is not None
    assert job.result.error_code == "TOOL.EXECUTION_FAILED", job.result
    kept = [(c.stream, c.text) for c in job.chunks]
    assert kept == [("stdout", "begun\n")]
    time.sleep(0.5)
    assert [(c.stream, c.text) for c in job.chunks] == kept
