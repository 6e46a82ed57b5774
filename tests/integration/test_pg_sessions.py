"""Sessions in PostgreSQL (`service_postgres`) on a real server: two store instances, and two
real `policy-engine serve` replicas plus a `policy-engine mcp --sessions` server (separate state
directories, one workspace volume) see the same session; the tenant cap holds across replicas;
a session is ended once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import httpx
import httpx2
import psycopg
import pytest
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client

from policy_engine.config import EngineConfig
from policy_engine.gateway.session_store import SessionInfo
from policy_engine.service.pg_sessions import PgSessionStore, open_session_store
from tests.integration.mcp_fixtures import make_setup
from tests.integration.service_server import POLICY, start
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    pg_dsn_fixture,
    pg_server_fixture,
)
from tests.integration.test_mcp_http import _serve

pytestmark = pytest.mark.integration


def _info(sid: str, tenant: str = "acme", subject: str = "agent:x", backend: str = "proc-bwrap",
          expires_ms: int = 4102444800000) -> SessionInfo:
    return SessionInfo(sid, tenant, subject, "permissive", backend, 1, expires_ms)


def test_two_store_instances_share_sessions_cap_and_end(tmp_path: Path, pg_dsn: str) -> None:
    config = EngineConfig(state_dir=tmp_path, options={"service_postgres": {"dsn": pg_dsn}})
    one, two = open_session_store(config), open_session_store(config)
    assert isinstance(one, PgSessionStore)
    assert isinstance(two, PgSessionStore)
    assert not (tmp_path / "sessions.db").exists()
    assert one.insert_capped(_info("s-1"), cap=8) is None
    assert two.get("acme", "agent:x", "s-1") == _info("s-1")
    assert two.get("acme", "agent:y", "s-1") is None  # another subject: not found
    assert two.get("evil", "agent:x", "s-1") is None
    two.extend("s-1", 4102444900000)
    assert one.get("acme", "agent:x", "s-1").expires_ms == 4102444900000  # type: ignore[union-attr]
    one.event(_info("s-1"), 5, "created", {"ttl_s": 60})
    assert two.events("s-1") == [{"at_ms": 5, "event": "created", "detail": {"ttl_s": 60}}]
    # a docker session is alone per owner, whichever replica creates the second
    assert one.insert_capped(_info("s-d1", backend="docker"), cap=8, alone_on="docker") is None
    assert two.insert_capped(_info("s-d2", backend="docker"), cap=8,
                             alone_on="docker") == "alone"
    # the cap holds when both replicas create at once: 20 racing creates, cap 6 (2 live)
    answers: list[str | None] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        got = (one, two)[i % 2].insert_capped(_info(f"s-r{i}", tenant="acme"), cap=6)
        with lock:
            answers.append(got)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers.count(None) == 4
    assert answers.count("cap") == 16
    # ended once: the second replica's end (its reaper, or a delete) is told it already was
    assert two.end("s-1", 10, "expired") is True
    assert one.end("s-1", 11, "deleted") is False
    ended = one.get("acme", "agent:x", "s-1")
    assert ended is not None
    assert (ended.ended_ms, ended.end_reason) == (10, "expired")
    due = two.due(4102444800000)  # every live session expires then; the ended one is not due
    assert due
    assert "s-1" not in {s.session_id for s in due}
    assert all(s.live for s in due)
    assert "s-1" not in {s.session_id for s in one.list("acme", "agent:x")}
    assert "s-1" in {s.session_id for s in one.list("acme", "agent:x", live_only=False)}
    with psycopg.connect(pg_dsn) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM service_sessions").fetchone()  # type: ignore[misc]
    assert rows == 2 + 4
    one.close()
    two.close()


def test_two_serve_replicas_see_the_same_session(tmp_path: Path, pg_dsn: str) -> None:
    shared = tmp_path / "volume"  # one workspace volume mounted by both replicas
    shared.mkdir()
    policy = POLICY.replace("{ws}", str(shared))
    replicas = []
    for name in ("a", "b"):
        root = tmp_path / name
        root.mkdir()
        config = root / "config.json"
        config.write_text(json.dumps({"options": {"service_postgres": {"dsn": pg_dsn}}}))
        replicas.append(start(root, "--config", str(config), "--workspace", str(shared),
                              "--security-mode", "permissive", policy_text=policy))
    try:
        made = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "add",
                               "--tenant", "acme", "--subject", "agent:x", "--config",
                               str(tmp_path / "a" / "config.json")], capture_output=True,
                              text=True, timeout=60, check=False)
        assert made.returncode == 0, made.stderr
        auth = {"Authorization": f"Bearer {made.stdout.strip()}"}
        a = httpx.Client(base_url=replicas[0].url, headers=auth, timeout=60)
        b = httpx.Client(base_url=replicas[1].url, headers=auth, timeout=60)
        with a, b:
            created = a.post("/v1/sessions", json={"backend": "proc-bwrap", "ttl_s": 300})
            assert created.status_code == 201, created.text
            sid = created.json()["session_id"]
            assert [s["session_id"] for s in b.get("/v1/sessions").json()["sessions"]] == [sid]
            assert b.get(f"/v1/sessions/{sid}").json()["status"] == "live"
            wrote = a.post(f"/v1/sessions/{sid}/run_code",
                           json={"code": "open('note.txt', 'w').write('from a')"}).json()
            assert wrote["success"], wrote
            read = b.post(f"/v1/sessions/{sid}/run_code",
                          json={"code": "print(open('note.txt').read())"}).json()
            assert read["stdout"] == "from a\n", read
            seen = _over_mcp(tmp_path, pg_dsn, shared, made.stdout.strip(), sid)
            assert seen == ("live", "from a\n")
            longer = b.post(f"/v1/sessions/{sid}/extend", json={"ttl_s": 900}).json()
            assert a.get(f"/v1/sessions/{sid}").json()["expires_ms"] == longer["expires_ms"]
            ended = b.delete(f"/v1/sessions/{sid}")
            assert ended.status_code == 200, ended.text
            gone = a.get(f"/v1/sessions/{sid}")
            assert gone.status_code == 404
            assert gone.json()["refusal"]["code"] == "SERVICE.NOT_FOUND"
            events = [e["event"] for e in a.get(f"/v1/sessions/{sid}/events").json()["events"]]
            assert events == ["created", "extended", "ended"]
        for r in replicas:
            assert not (r.state / "sessions.db").exists()
    finally:
        logs = [r.stop() for r in replicas]
    assert all("Traceback" not in log for log in logs), logs


def _over_mcp(tmp_path: Path, pg_dsn: str, shared: Path, token: str, sid: str
              ) -> tuple[str, str]:
    """The session through an MCP server on the same database and volume (its own state
    directory): its status and what a call there reads from the workspace."""
    setup = make_setup(tmp_path / "mcp", f'permit "ws" fs.read, fs.write, fs.list  paths '
                       f'["{shared}/**"]\n')
    config = setup.root / "config.json"
    config.write_text(json.dumps({"options": {"service_postgres": {"dsn": pg_dsn}}}))
    serving = _serve(setup, {"acme": token}, "--sessions", "--workspace", str(shared),
                     "--security-mode", "permissive", "--config", str(config))
    server = next(serving)

    async def main() -> tuple[str, str]:
        auth = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30, read=120))
        async with auth, McpClient(streamable_http_client(server.url, http_client=auth),
                                   read_timeout_seconds=120) as client:
            got = await client.call_tool("session.get", {"session_id": sid})
            ran = await client.call_tool("session.run_code", {
                "session_id": sid, "code": "print(open('note.txt').read())"})
            assert got.structured_content is not None, got
            assert ran.structured_content is not None, ran
            return (str(got.structured_content["status"]),
                    str(ran.structured_content["stdout"]))

    try:
        return anyio.run(main)
    finally:
        next(serving, None)
