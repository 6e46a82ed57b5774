"""The session tools of `policy-engine mcp --sessions`, over stdio and streamable HTTP, driven
by the official SDK's client: lifecycle, run_code, files (text back to the model), execs that
stream progress notifications, and `notifications/cancelled` killing the exec for real."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.integration.mcp_fixtures import Setup, make_setup
from tests.integration.test_mcp_http import Server, _serve

pytestmark = pytest.mark.integration

_FILES = 'permit "session-files" fs.read, fs.write, fs.list  paths ["{ws}/**"]\n'


def _setup(root: Path) -> Setup:
    return make_setup(root, _FILES.format(ws=root / "ws"))


def _session_args(setup: Setup) -> tuple[str, ...]:
    return ("--sessions", "--workspace", str(setup.root / "ws"),
            "--security-mode", "permissive")


@asynccontextmanager
async def stdio(setup: Setup) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable, env=setup.env(),
        args=setup.mcp_args("--tenant", "acme", "--subject", "agent:s", *_session_args(setup)))
    async with Client(params, read_timeout_seconds=120) as client:
        yield client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    setup = _setup(tmp_path_factory.mktemp("mcp-sessions-http"))
    tokens = {who: setup.add_token(who, f"agent:{who}") for who in ("acme", "red")}
    yield from _serve(setup, tokens, *_session_args(setup))


@asynccontextmanager
async def http(server: Server, who: str) -> AsyncIterator[Client]:
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {server.tokens[who]}"},
                                timeout=httpx2.Timeout(30, read=120))
    async with client, Client(streamable_http_client(server.url, http_client=client),
                              read_timeout_seconds=120) as mcp:
        yield mcp


async def _ok(client: Client, name: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
    result = await client.call_tool(name, args, **kw)
    assert not result.is_error, result
    assert result.structured_content is not None
    return dict(result.structured_content)


async def _refusal(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert result.is_error, result
    assert result.structured_content is not None
    doc: dict[str, Any] = result.structured_content["refusal"]
    assert result.content[0].text.startswith(f"{doc['code']}: ")  # type: ignore[union-attr]
    return doc


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


async def _lifecycle(client: Client) -> str:
    names = {t.name for t in (await client.list_tools()).tools}
    assert {"session.create", "session.run_code", "session.exec", "session.exec.cancel",
            "session.files.read", "session.delete"} <= names
    s = await _ok(client, "session.create", {"backend": "proc-bwrap", "ttl_s": 120})
    sid = s["session_id"]
    assert (s["backend"], s["status"]) == ("proc-bwrap", "live")
    assert [x["session_id"] for x in (await _ok(client, "session.list", {}))["sessions"]] \
        == [sid]
    longer = await _ok(client, "session.extend", {"session_id": sid, "ttl_s": 3600})
    assert longer["expires_ms"] > s["expires_ms"]
    up = await _ok(client, "session.files.upload",
                   {"session_id": sid, "path": "data/in.csv", "text": "a,b\n1,2\n"})
    assert up["size"] == 8
    assert up["envelope_id"]
    ran = await _ok(client, "session.run_code", {
        "session_id": sid, "stateful": True,
        "code": "rows = open('data/in.csv').read().splitlines()\n"
                "open('out.txt', 'w').write('rows=%d\\n' % len(rows))"})
    assert ran["success"], ran
    again = await _ok(client, "session.run_code", {"session_id": sid, "stateful": True,
                                                   "code": "print(len(rows))"})
    assert again["stdout"] == "2\n"
    # the model reads a UTF-8 file as text, not base64
    read = await client.call_tool("session.files.read", {"session_id": sid, "path": "out.txt"})
    assert not read.is_error, read
    assert read.content[0].text == "rows=2\n"  # type: ignore[union-attr]
    assert read.structured_content is not None
    assert read.structured_content["text"] == "rows=2\n"
    assert "bytes_b64" not in read.structured_content
    await _ok(client, "session.files.upload",
              {"session_id": sid, "path": "bin.dat", "content_b64": "gAD/"})
    binary = await _ok(client, "session.files.read", {"session_id": sid, "path": "bin.dat"})
    assert binary["bytes_b64"] == "gAD/"
    assert "text" not in binary
    listed = await _ok(client, "session.files.list", {"session_id": sid})
    assert {"out.txt", "bin.dat"} <= {Path(e["path"]).name for e in listed["entries"]}
    await _ok(client, "session.files.delete", {"session_id": sid, "path": "bin.dat"})
    gone = await _refusal(client, "session.files.read", {"session_id": sid, "path": "bin.dat"})
    # a deleted file is missing, as `/v1/ops` and HTTP session files say it: not "no session"
    assert (gone["code"], gone["http_status"], gone["refused_by"]) == (
        "TOOL.NOT_FOUND", 404, "backend"), gone
    # a risk hint needing a container is refused on this bubblewrap session, not moved
    risky = await _refusal(client, "session.run_code", {
        "session_id": sid, "code": "import subprocess\nsubprocess.run(['id'])"})
    assert (risky["code"], risky["refused_by"]) == ("SANDBOX.CAPABILITY_BLOCKED", "backend")
    bad = await _refusal(client, "session.run_code", {"session_id": sid, "code": 5})
    assert (bad["code"], bad["location"]) == ("SCHEMA.VALIDATION_FAILED", "/code")
    started = await _ok(client, "session.exec", {"session_id": sid, "code": "print(7)",
                                                 "wait": False})
    assert started["status"] in ("queued", "running", "completed")
    deadline = time.monotonic() + 30
    polled = started
    while polled["status"] != "completed" and time.monotonic() < deadline:
        polled = await _ok(client, "session.exec.get",
                           {"session_id": sid, "exec_id": started["exec_id"]})
    assert polled["result"]["stdout"] == "7\n"
    return str(sid)


async def _streams_then_cancels(client: Client, setup: Setup, sid: str) -> None:
    seen: list[tuple[float, float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((time.monotonic(), value, message))

    code = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n" \
           "    time.sleep(0.7)\n"
    done = await _ok(client, "session.exec", {"session_id": sid, "code": code},
                     progress_callback=progress)
    ended = time.monotonic()
    assert done["status"] == "completed"
    assert done["result"]["stdout"] == "tick 0\ntick 1\ntick 2\n"
    assert [m for _, _, m in seen] == ["tick 0\n", "tick 1\n", "tick 2\n"]
    assert [v for _, v, _ in seen] == sorted(v for _, v, _ in seen)
    assert seen[0][0] < ended - 1.0  # streamed while it ran, not at the end
    # notifications/cancelled: the process group is killed, the evidence ends cancelled
    marker = f"mcp-cancel-{sid}"
    seen.clear()
    running: list[int] = []
    with anyio.move_on_after(30) as scope:
        async def cancel_at_first(progress: float, total: float | None,
                                  message: str | None) -> None:
            seen.append((time.monotonic(), progress, message))
            running.extend(_processes_with(marker))  # it runs: the check below can fail
            scope.cancel()

        await client.call_tool("session.exec", {
            "session_id": sid, "timeout_s": 50,
            "code": f"import time  # {marker}\nprint('begun', flush=True)\ntime.sleep(40)"},
            progress_callback=cancel_at_first)
    assert scope.cancelled_caught
    assert seen
    assert seen[0][2] == "begun\n"
    assert running
    cancelled_at = time.monotonic()
    ends: list[dict[str, Any]] = []
    while time.monotonic() < cancelled_at + 20 and not ends:
        ends = [r for r in setup.evidence() if r.get("type") == "end"
                and r.get("sandbox_error_kind") == "cancelled"]
        await anyio.sleep(0.1)
    assert len(ends) == 1, [r for r in setup.evidence() if r.get("type") == "end"]
    assert ends[0]["status"] == "error"
    assert _processes_with(marker) == []
    # the session goes on: a later call runs, and the delete releases it
    assert (await _ok(client, "session.run_code", {"session_id": sid, "code": "print(1)"}
                      ))["stdout"] == "1\n"
    deleted = await _ok(client, "session.delete", {"session_id": sid})
    assert deleted["reason"] == "deleted"
    assert deleted["workspace_removed"] is True
    missing = await _refusal(client, "session.get", {"session_id": sid})
    assert (missing["code"], missing["http_status"]) == ("SERVICE.NOT_FOUND", 404)


def test_sessions_over_stdio(tmp_path: Path) -> None:
    setup = _setup(tmp_path)

    async def main() -> None:
        async with stdio(setup) as client:
            sid = await _lifecycle(client)
            await _streams_then_cancels(client, setup, sid)
            # every call was a guarded op of tenant acme with its own evidence
            begins = [r for r in setup.evidence() if r.get("type") == "begin"]
            assert begins
            assert all(json.dumps(r).count("acme") for r in begins)

    anyio.run(main)


def test_sessions_over_http_belong_to_the_token(server: Server) -> None:
    async def main() -> None:
        async with http(server, "acme") as acme, http(server, "red") as red:
            sid = await _lifecycle(acme)
            for name, args in (("session.get", {"session_id": sid}),
                               ("session.run_code", {"session_id": sid, "code": "print(1)"}),
                               ("session.files.read", {"session_id": sid, "path": "out.txt"}),
                               ("session.delete", {"session_id": sid})):
                refused = await _refusal(red, name, args)
                assert (refused["code"], refused["http_status"]) == ("SERVICE.NOT_FOUND", 404)
            assert (await _ok(red, "session.list", {}))["sessions"] == []
            await _streams_then_cancels(acme, server.setup, sid)

    anyio.run(main)


def test_a_skill_in_a_session_over_http(server: Server) -> None:
    """`session.skill`: a file skill reads the session's workspace (`work/`), the model gets
    the text; another token's call is 404; an unknown skill is 404 too."""
    async def main() -> None:
        async with http(server, "acme") as acme, http(server, "red") as red:
            sid = (await _ok(acme, "session.create", {"backend": "proc-bwrap"}))["session_id"]
            await _ok(acme, "session.files.upload",
                      {"session_id": sid, "path": "note.txt", "text": "dear model"})
            call = {"session_id": sid, "skill": "files.read",
                    "inputs": {"path": "work/note.txt"}}
            result = await acme.call_tool("session.skill", call)
            assert not result.is_error, result
            assert result.structured_content is not None
            assert result.structured_content["output"]["text"] == "dear model"
            assert result.content[0].text == "dear model"  # type: ignore[union-attr]
            env = result.structured_content["envelope_id"]
            begin = next(r for r in server.setup.evidence()
                         if r.get("type") == "begin" and r.get("envelope_id") == env)
            assert begin["annotations"] == {"session": sid, "skill": "files.read"}, begin
            refused = await _refusal(red, "session.skill", call)
            assert (refused["code"], refused["http_status"]) == ("SERVICE.NOT_FOUND", 404)
            unknown = await _refusal(acme, "session.skill", {**call, "skill": "no.such"})
            assert (unknown["code"], unknown["http_status"]) == ("SERVICE.NOT_FOUND", 404)
            await _ok(acme, "session.delete", {"session_id": sid})

    anyio.run(main)
