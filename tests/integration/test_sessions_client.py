"""`policy_engine.client` against the real server (loopback, real bubblewrap): sessions, files,
streamed execs, cancel, run_code, decide and a refused op raising PolicyRefusal."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from policy_engine.client import AsyncClient, Client, PolicyRefusal
from tests.integration.service_server import Service, add_token, grant, serving

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("client"), "--security-mode",
                 "permissive") as service:
        yield service


def test_the_sync_client_covers_a_session(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:alice")
    with Client(svc.url, token) as c:
        s = c.create_session(backend="proc-bwrap", ttl_s=300)
        assert [x.session_id for x in c.list_sessions()] == [s.session_id]
        assert c.extend_session(s.session_id, 900).expires_ms > s.expires_ms
        written = c.upload(s.session_id, "in/data.txt", b"abc")
        assert written.size == 3
        assert c.download(s.session_id, "in/data.txt") == b"abc"
        assert "in/data.txt" in {e["path"] for e in c.list_files(s.session_id)}
        assert c.run_code(s.session_id, "n = len(open('in/data.txt').read())",
                          stateful=True).success
        doubled = c.run_code(s.session_id, "print(n * 2)", stateful=True)
        assert doubled.stdout == "6\n"
        assert doubled.interpreter is not None
        assert doubled.interpreter["fresh"] is False
        assert c.restart_interpreter(s.session_id)["killed"] is True
        lost = c.run_code(s.session_id, "print('n' in dir())", stateful=True)
        assert lost.stdout == "False\n"
        assert lost.interpreter is not None
        assert lost.interpreter["state_lost"] == "restarted on request"
        job = c.start_exec(s.session_id, "import time\nfor i in range(3):\n"
                           "    print(i, flush=True)\n    time.sleep(0.2)")
        events = list(c.stream_exec(s.session_id, job.exec_id))
        assert "".join(e.text for e in events if e.event == "stdout") == "0\n1\n2\n"
        final = events[-1].final
        assert final is not None
        assert final.status == "completed"
        slow = c.start_exec(s.session_id, "import time\ntime.sleep(30)")
        assert c.cancel_exec(s.session_id, slow.exec_id).status == "cancelled"
        assert len(c.delete_file(s.session_id, "in/data.txt")) == 32
        with pytest.raises(PolicyRefusal) as missing:
            c.download(s.session_id, "in/data.txt")
        assert missing.value.refusal.http_status == 404
        root = svc.root
        body = {"op": {"kind": "fs.read", "path": f"{root}/data/secret/key.txt"},
                "grant": grant("acme", "agent:alice", root), "manifest": "reader"}
        assert c.decide(body)["decision"] == "deny"
        with pytest.raises(PolicyRefusal) as refused:
            c.op(body)
        assert refused.value.refusal.code == "SANDBOX.CAPABILITY_BLOCKED"
        assert refused.value.envelope_id is not None
        evidence = "\n".join(p.read_text() for p in svc.state.rglob("*.jsonl"))
        assert refused.value.envelope_id in evidence
        body["op"] = {"kind": "fs.read", "path": f"{root}/data/hello.txt"}
        assert c.op(body).ok
        c.delete_session(s.session_id)
        with pytest.raises(PolicyRefusal) as gone:
            c.get_session(s.session_id)
        assert gone.value.refusal.code == "SERVICE.NOT_FOUND"


def test_the_async_client_streams_and_refuses(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:bob")

    async def main() -> tuple[str, str, int]:
        async with AsyncClient(svc.url, token) as c:
            s = await c.create_session(backend="proc-bwrap")
            await c.run_code(s.session_id, "k = 1", stateful=True)
            restarted = await c.restart_interpreter(s.session_id)
            assert restarted["killed"] is True
            await c.upload_b64(s.session_id, "x.txt", b"hi")
            job = await c.start_exec(s.session_id, "print(open('x.txt').read())")
            text = "".join([e.text async for e in c.stream_exec(s.session_id, job.exec_id)
                            if e.event == "stdout"])
            ran = await c.run_code(s.session_id, "print(7)")
            try:
                await c.get_session("s-" + "0" * 24)
            except PolicyRefusal as refused:
                return text, ran.stdout, refused.refusal.http_status
            return text, ran.stdout, 0

    assert asyncio.run(main()) == ("hi\n", "7\n", 404)
