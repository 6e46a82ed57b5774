"""A docker session's exec streams over the faces while it runs (issue 28 item 4), as a
proc-bwrap session's does: Server-Sent Events from a real `policy-engine serve` and MCP
progress notifications from `policy-engine mcp --sessions`, both with the executor's warm pool
(`options.docker.mode: pool`, as docs/sessions.md's recipe configures it).

Before: the first event carrying the code's first line came with the exec's end, two seconds
after the code printed it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.integration.mcp_fixtures import make_setup
from tests.integration.service_server import add_token, serving
from tests.integration.test_docker_streaming import TALK
from tests.integration.test_sessions_http import _events

pytestmark = pytest.mark.integration

ENGINE_YAML = "options:\n  docker: {mode: pool, pool_size: 1}\n"


def test_a_docker_session_exec_streams_over_sse(tmp_path: Path) -> None:
    (tmp_path / "engine.yaml").write_text(ENGINE_YAML)
    with serving(tmp_path, "--security-mode", "permissive",
                 "--config", str(tmp_path / "engine.yaml")) as svc:
        token = add_token(svc.state, "acme", "agent:docker")
        with svc.client(token) as c:
            made = c.post("/v1/sessions", json={"backend": "docker"})
            assert made.status_code == 201, made.text
            sid = made.json()["session_id"]
            job = c.post(f"/v1/sessions/{sid}/execs",
                         json={"code": TALK, "wait": False, "timeout_s": 60}).json()
            seen: list[tuple[float, str, dict[str, object]]] = []
            with c.stream("GET", f"/v1/sessions/{sid}/execs/{job['exec_id']}/events") as resp:
                for kind, data in _events(resp.iter_lines()):
                    seen.append((time.monotonic(), kind, data))
        ended = next(t for t, kind, _ in seen if kind == "end")
        firsts = [t for t, kind, d in seen
                  if kind == "stdout" and "first-marker" in str(d["text"])]
        assert firsts, seen
        first = firsts[0]
        assert first < ended - 1.5, seen  # while the code slept, not with the end
        assert [kind for _, kind, _ in seen] == ["stdout", "stderr", "stdout", "end"], seen
        final = seen[-1][2]
        result = final["result"]
        assert isinstance(result, dict)
        assert result["sandbox_type"] == "docker", result
        assert result["stdout"] == "first-marker\nsecond-marker\n"
        assert "".join(str(d["text"]) for _, k, d in seen if k == "stdout") == result["stdout"]


def test_a_docker_session_exec_sends_mcp_progress_while_it_runs(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, 'permit "session-files" fs.read, fs.write, fs.list  '
                                 f'paths ["{tmp_path / "ws"}/**"]\n')
    (tmp_path / "engine.yaml").write_text(ENGINE_YAML)
    params = StdioServerParameters(
        command=sys.executable, env=setup.env(),
        args=setup.mcp_args("--tenant", "acme", "--subject", "agent:s", "--sessions",
                            "--workspace", str(tmp_path / "ws"), "--security-mode",
                            "permissive", "--config", str(tmp_path / "engine.yaml")))
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((time.monotonic(), message))

    async def main() -> float:
        async with Client(params, read_timeout_seconds=120) as client:
            made = await client.call_tool("session.create", {"backend": "docker"})
            assert made.structured_content is not None, made
            sid = made.structured_content["session_id"]
            done = await client.call_tool("session.exec", {"session_id": sid, "code": TALK,
                                                           "timeout_s": 60},
                                          progress_callback=progress)
            ended = time.monotonic()
            assert not done.is_error, done
            assert done.structured_content is not None
            assert done.structured_content["status"] == "completed", done
            assert done.structured_content["result"]["stdout"] == \
                "first-marker\nsecond-marker\n"
            return ended

    ended = anyio.run(main)
    assert [m for _, m in seen] == ["first-marker\n", "[stderr] err-marker\n",
                                 "second-marker\n"], seen
    assert seen[0][0] < ended - 1.5, (seen, ended)
