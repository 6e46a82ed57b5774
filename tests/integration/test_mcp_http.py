"""`policy-engine mcp --transport http` (streamable HTTP) on loopback, driven by the official
SDK's client: the service's bearer tokens, each call as the token's tenant, evidence."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.integration.mcp_fixtures import (
    BEAT_SCRIPT,
    Setup,
    assert_beat_stopped,
    make_setup,
    wait_for_beat,
)

pytestmark = pytest.mark.integration


@dataclass
class Server:
    setup: Setup
    url: str
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    setup = make_setup(tmp_path_factory.mktemp("mcp-http"))
    tokens = {who: setup.add_token(who, f"agent:{who}") for who in ("acme", "red", "gone")}
    revoke = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "tokens", "revoke",
         tokens["gone"].split(".")[0].removeprefix("pet_"), "--state-dir", str(setup.state)],
        capture_output=True, text=True, timeout=60, env=setup.env(), check=False)
    assert revoke.returncode == 0, revoke.stderr
    reader = setup.root / "reader.json"
    reader.write_text(json.dumps({
        "name": "reader", "version": "1.0.0", "side_effects": ["Read"],
        "permissions": [{"kind": "fs.read", "paths": [f"{setup.root}/inputs/**"]}]}))
    yield from _serve(setup, tokens, "--manifest", str(reader))


def _serve(setup: Setup, tokens: dict[str, str], *extra: str) -> Iterator[Server]:
    log = setup.root / "mcp.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, *setup.mcp_args("--transport", "http",
                                                                 "--port", "0", *extra)],
                                stdout=subprocess.DEVNULL, stderr=sink, env=setup.env())
    try:
        deadline = time.monotonic() + 30
        match = None
        while match is None:
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+/mcp)", log.read_text())
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        while True:  # bound before uvicorn serves: wait for the first answer
            try:
                httpx.post(match.group(1), timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        yield Server(setup, match.group(1), tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "Traceback" not in log.read_text()


@asynccontextmanager
async def connect(server: Server, who: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {server.tokens[who]}"},
                              timeout=httpx2.Timeout(30, read=120))
    async with http, Client(streamable_http_client(server.url, http_client=http),
                            read_timeout_seconds=120) as client:
        yield client


def _error(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    error: dict[str, Any] = (result.meta or {})["policy-engine/error"]
    return error


def _begin(setup: Setup, envelope: str) -> dict[str, Any]:
    found = [r for r in setup.evidence()
             if r.get("type") == "begin" and r.get("envelope_id") == envelope]
    assert len(found) == 1
    return found[0]


def test_no_unknown_or_revoked_token_gets_in(server: Server) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in (None, "Bearer pet_0000000000000000.nope", f"Bearer {server.tokens['gone']}"):
        sent = {**headers, **({"Authorization": auth} if auth else {})}
        answer = httpx.post(server.url, json=body, headers=sent, timeout=10)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "AUTH.UNAUTHENTICATED"
        assert "tools" not in answer.text


def test_list_and_calls_run_as_the_token_tenant(server: Server) -> None:
    setup = server.setup

    async def main() -> None:
        async with connect(server, "acme") as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert "skill.files.read" in tools
            assert len(tools) == 6
            op = await client.call_tool("op.reader", {"op": {
                "kind": "fs.read", "path": str(setup.root / "inputs" / "hello.txt")}})
            assert not op.is_error, op
            assert _begin(setup, (op.meta or {})["policy-engine/envelope_id"])["tenant"] == "acme"
            ok = await client.call_tool("skill.files.read", {"path": "inputs/hello.txt"})
            assert not ok.is_error, ok
            begin = _begin(setup, (ok.meta or {})["policy-engine/envelope_id"])
            assert (begin["tenant"], begin["subject_id"]) == ("acme", "agent:acme")
            denied = _error(await client.call_tool("skill.files.read",
                                                   {"path": "inputs/secret/key.txt"}))
            assert denied["code"] == "SANDBOX.CAPABILITY_BLOCKED"
            assert [e["status"] for e in setup.ends(denied["envelope_id"])] == ["denied"]
            bad = _error(await client.call_tool("skill.python.run", {"code": ["x"]}))
            assert (bad["code"], bad["pointer"]) == ("SCHEMA.VALIDATION_FAILED", "/code")

    anyio.run(main)


def test_concurrent_clients_of_two_tenants(server: Server) -> None:
    seen: list[tuple[str, str]] = []

    async def main() -> None:
        async def one(who: str, i: int) -> None:
            async with connect(server, who) as client:
                if i % 2:
                    result = await client.call_tool("skill.shell.run",
                                                    {"script": f"echo {who}-{i}"})
                    assert result.structured_content["stdout"] == f"{who}-{i}\n"
                else:
                    result = await client.call_tool("skill.files.read",
                                                    {"path": "inputs/hello.txt"})
                assert not result.is_error, result
                seen.append((who, (result.meta or {})["policy-engine/envelope_id"]))

        async with anyio.create_task_group() as tg:
            for i in range(3):
                for who in ("acme", "red"):
                    tg.start_soon(one, who, i)

    anyio.run(main)
    assert len(seen) == 6
    for who, envelope in seen:
        assert _begin(server.setup, envelope)["tenant"] == who


def test_a_cancelled_http_call_is_stopped_and_recorded(server: Server) -> None:
    setup = server.setup
    before = {r["envelope_id"] for r in setup.evidence() if r.get("type") == "end"}

    async def main() -> None:
        async with connect(server, "red") as client:
            scope = anyio.CancelScope()

            async def call() -> None:
                with scope:
                    await client.call_tool(
                        "skill.shell.run", {"script": BEAT_SCRIPT.format(name="beat-http.txt")})

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                beat = await wait_for_beat(Path(setup.state), "beat-http.txt")  # it runs
                scope.cancel()
            assert scope.cancelled_caught
            deadline = time.monotonic() + 30
            new: list[dict[str, Any]] = []
            while time.monotonic() < deadline and not new:
                new = [r for r in setup.evidence() if r.get("type") == "end"
                       and r["envelope_id"] not in before
                       and r.get("sandbox_error_kind") == "cancelled"]
                await anyio.sleep(0.2)
            assert len(new) == 1
            await assert_beat_stopped(beat)  # stopped, not abandoned: it writes no more

    anyio.run(main)


def test_a_session_belongs_to_the_token_that_opened_it(server: Server) -> None:
    headers = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}
    acme = {**headers, "Authorization": f"Bearer {server.tokens['acme']}"}
    opened = httpx.post(server.url, json=init, headers=acme, timeout=10)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "skill.files.read", "arguments": {"path": "inputs/hello.txt"}}}
    red = {**headers, "Authorization": f"Bearer {server.tokens['red']}",
           "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
    before = len(server.setup.evidence())
    hijack = httpx.post(server.url, json=call, headers=red, timeout=10)
    assert hijack.status_code == 404, hijack.text
    listen = httpx.get(server.url, headers=red, timeout=10)
    assert listen.status_code == 404
    assert len(server.setup.evidence()) == before
    # the owner's own session still works
    own = httpx.post(server.url, json={"jsonrpc": "2.0", "method":
                                       "notifications/initialized"},
                     headers={**acme, "mcp-session-id": session,
                              "mcp-protocol-version": "2025-06-18"}, timeout=10)
    assert own.status_code == 202, own.text


def test_a_token_revoked_mid_session_stops_working_at_once(server: Server) -> None:
    setup = server.setup
    token = setup.add_token("acme", "agent:short-lived")
    token_id = token.split(".")[0].removeprefix("pet_")
    server.tokens["short"] = token

    async def main() -> None:
        async with connect(server, "short") as client:
            ok = await client.call_tool("skill.files.read", {"path": "inputs/hello.txt"})
            assert not ok.is_error
            done = subprocess.run(
                [sys.executable, "-m", "policy_engine.cli", "tokens", "revoke", token_id,
                 "--state-dir", str(setup.state)], capture_output=True, text=True,
                timeout=60, env=setup.env(), check=False)
            assert done.returncode == 0, done.stderr
            before = len(setup.evidence())
            # the transport answers 401 before the MCP layer: the SDK raises the error
            with pytest.raises(MCPError):
                await client.call_tool("skill.files.read", {"path": "inputs/hello.txt"})
            assert len(setup.evidence()) == before

    anyio.run(main)


def test_requests_over_the_tenant_rate_are_refused(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    tokens = {"acme": setup.add_token("acme", "agent:a"), "red": setup.add_token("red", "r")}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for srv in _serve(setup, tokens, "--rate-per-minute", "3"):
        answers = [httpx.post(srv.url, json=body, timeout=10, headers={
            **headers, "Authorization": f"Bearer {tokens['acme']}"}) for _ in range(7)]
        statuses = [a.status_code for a in answers]
        # 3 a minute: the 4th is refused (the 7th, should the minute turn in between)
        assert 429 not in statuses[:3]
        refused = [a for a in answers if a.status_code == 429]
        assert refused
        assert refused[0].json()["error"]["code"] == "QUOTA.BUDGET_EXCEEDED"
        # another tenant has its own count
        other = httpx.post(srv.url, json=body, timeout=10, headers={
            **headers, "Authorization": f"Bearer {tokens['red']}"})
        assert other.status_code != 429
