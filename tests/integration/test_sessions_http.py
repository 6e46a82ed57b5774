"""`/v1/sessions` on the real server (a subprocess on a loopback port, real bubblewrap):
lifecycle, owner-only 404s in the one refusal shape, files kept between calls, delete ending
a running call."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.service_server import Service, add_token, serving

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("sessions"), "--security-mode",
                 "permissive") as service:
        yield service


def _refused(resp: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["error"]["code"] == code
    refusal: dict[str, object] = body["refusal"]
    assert refusal["code"] == code
    assert refusal["http_status"] == status
    assert set(refusal) >= {"refused_by", "rule", "consent", "envelope_id", "location"}
    return refusal


def test_session_lifecycle_over_http(svc: Service) -> None:
    alice = add_token(svc.state, "acme", "agent:alice")
    bob = add_token(svc.state, "acme", "agent:bob")
    eve = add_token(svc.state, "evil", "agent:alice")
    with svc.client(alice) as c, svc.client(bob) as b, svc.client(eve) as e:
        made = c.post("/v1/sessions", json={"ttl_s": 120, "backend": "proc-bwrap"})
        assert made.status_code == 201, made.text
        s = made.json()
        sid = s["session_id"]
        assert (s["tenant"], s["subject"], s["status"]) == ("acme", "agent:alice", "live")
        assert [x["session_id"] for x in c.get("/v1/sessions").json()["sessions"]] == [sid]
        assert b.get("/v1/sessions").json()["sessions"] == []
        for other in (b, e):
            for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/extend"),
                                 ("POST", "/run_code"), ("GET", "/events")):
                body = {"code": "print(1)"} if path == "/run_code" else {}
                resp = other.request(method, f"/v1/sessions/{sid}{path}",
                                     json=body if method == "POST" else None)
                _refused(resp, 404, "SERVICE.NOT_FOUND")
        wrote = c.post(f"/v1/sessions/{sid}/run_code",
                       json={"code": "open('n.txt','w').write('kept')"}).json()
        assert wrote["success"], wrote
        read = c.post(f"/v1/sessions/{sid}/run_code",
                      json={"code": "cat n.txt", "language": "shell"}).json()
        assert read["success"], read
        assert read["stdout"] == "kept"
        longer = c.post(f"/v1/sessions/{sid}/extend", json={"ttl_s": 600}).json()
        assert longer["expires_ms"] > s["expires_ms"]
        ended = c.delete(f"/v1/sessions/{sid}")
        assert ended.status_code == 200
        assert ended.json()["workspace_removed"] is True
        _refused(c.get(f"/v1/sessions/{sid}"), 404, "SERVICE.NOT_FOUND")
        events = c.get(f"/v1/sessions/{sid}/events").json()["events"]
        assert [x["event"] for x in events] == ["created", "extended", "ended"]
        bad = _refused(c.post("/v1/sessions", json={"ttl_s": 0}), 422,
                       "SCHEMA.VALIDATION_FAILED")
        assert bad["refused_by"] == "service"
        _refused(c.get("/v1/sessions/not-a-session"), 400, "SERVICE.BAD_REQUEST")


def test_delete_over_http_ends_a_running_call(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:carol")
    with svc.client(token) as c:
        sid = c.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
        box: dict[str, httpx.Response] = {}

        def call() -> None:
            with svc.client(token) as runner:
                box["r"] = runner.post(f"/v1/sessions/{sid}/run_code", timeout=60,
                                       json={"code": "import time\ntime.sleep(30)",
                                             "timeout_s": 60})

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(1.5)
        started = time.monotonic()
        ended = c.delete(f"/v1/sessions/{sid}").json()
        thread.join(timeout=20)
    assert time.monotonic() - started < 10
    assert ended["calls_cancelled"] == 1
    assert ended["calls_drained"] is True
    result = box["r"].json()
    assert result["success"] is False
    assert result["error_code"] == "TOOL.EXECUTION_FAILED"
    assert result["refusal"]["envelope_id"] == result["exec_id"]


def test_session_files_over_http(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:dora")
    other = add_token(svc.state, "globex", "agent:dora")
    blob = bytes(range(256)) * 600  # 153 600 bytes: three guarded reads
    with svc.client(token) as c, svc.client(other) as o:
        sid = c.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
        raw = c.put(f"/v1/sessions/{sid}/files/in/blob.bin", content=blob)
        assert raw.status_code == 201, raw.text
        assert raw.json()["size"] == len(blob)
        as_json = c.post(f"/v1/sessions/{sid}/files", json={
            "path": "note.txt", "content_b64": base64.b64encode(b"hello").decode()})
        assert as_json.status_code == 201, as_json.text
        form = c.put(f"/v1/sessions/{sid}/files/form.txt",
                     files={"file": ("form.txt", b"from a form")})
        assert form.status_code == 201, form.text
        ran = c.post(f"/v1/sessions/{sid}/run_code", json={
            "language": "shell", "code": "cat note.txt form.txt; wc -c < in/blob.bin"}).json()
        assert ran["stdout"] == f"hellofrom a form{len(blob)}\n", ran
        with c.stream("GET", f"/v1/sessions/{sid}/files/in/blob.bin") as got:
            assert got.status_code == 200
            assert b"".join(got.iter_bytes()) == blob
        listed = c.get(f"/v1/sessions/{sid}/files").json()
        assert {"in/blob.bin", "note.txt", "form.txt"} <= {e["path"] for e in listed["entries"]}
        too_big = c.put(f"/v1/sessions/{sid}/files/big.bin", content=b"x" * ((1 << 20) + 1))
        _refused(too_big, 413, "SERVICE.PAYLOAD_TOO_LARGE")
        _refused(o.get(f"/v1/sessions/{sid}/files/note.txt"), 404, "SERVICE.NOT_FOUND")
        # a missing file of one's own session is the answer `/v1/ops` and MCP give a missing
        # file (TOOL.NOT_FOUND, by the backend, not retryable), not "no such session"
        for missing in (c.get(f"/v1/sessions/{sid}/files/missing.txt"),
                        c.get(f"/v1/sessions/{sid}/files", params={"path": "no/dir"}),
                        c.delete(f"/v1/sessions/{sid}/files/missing.txt")):
            refusal = _refused(missing, 404, "TOOL.NOT_FOUND")
            assert (refusal["refused_by"], refusal["retryable"]) == ("backend", False), refusal
            assert isinstance(refusal["envelope_id"], str), refusal
        # deleting a directory is no "not found": the path names something that is not a file
        made_dir = c.put(f"/v1/sessions/{sid}/files/keep/inner/x.txt", content=b"x")
        assert made_dir.status_code == 201, made_dir.text
        _refused(c.delete(f"/v1/sessions/{sid}/files/keep"), 422, "SCHEMA.VALIDATION_FAILED")
        _refused(c.put(f"/v1/sessions/{sid}/files/a/%2E%2E/%2E%2E/x", content=b"x"), 422,
                 "SCHEMA.VALIDATION_FAILED")
        gone = c.delete(f"/v1/sessions/{sid}/files/note.txt")
        assert gone.status_code == 200, gone.text
        assert len(gone.json()["envelope_id"]) == 32
        _refused(c.get(f"/v1/sessions/{sid}/files/note.txt"), 404, "TOOL.NOT_FOUND")
    state_files = [p for p in (svc.state / "workspace").rglob("big.bin")]
    assert state_files == []


def _events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, object]]]:
    kind = ""
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            yield kind, json.loads(line[6:])


def test_async_exec_streams_polls_and_cancels(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:erin")
    # logging writes stderr (unbuffered); `import sys` would need a container (risk hint)
    code = ("import logging, time\nlogging.basicConfig(format='%(message)s')\n"
            "for i in range(3):\n    print('out', i, flush=True)\n"
            "    logging.warning('err %d', i)\n    time.sleep(0.3)\n")
    with svc.client(token) as c:
        sid = c.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
        started = time.monotonic()
        made = c.post(f"/v1/sessions/{sid}/execs", json={"code": code, "wait": False})
        assert made.status_code == 202, made.text
        assert time.monotonic() - started < 0.8  # answered before the code's ~0.9 s
        job = made.json()
        assert job["status"] in ("queued", "running")
        assert job["result"] is None
        seen: list[tuple[str, dict[str, object]]] = []
        with c.stream("GET", f"/v1/sessions/{sid}/execs/{job['exec_id']}/events") as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            seen = list(_events(resp.iter_lines()))
        outs = "".join(str(d["text"]) for k, d in seen if k == "stdout")
        errs = "".join(str(d["text"]) for k, d in seen if k == "stderr")
        assert outs == "out 0\nout 1\nout 2\n"
        assert errs == "err 0\nerr 1\nerr 2\n"
        seqs = [d["seq"] for k, d in seen if k in ("stdout", "stderr")]
        assert seqs == sorted(seqs)
        assert seen[-1][0] == "end"
        final = c.get(f"/v1/sessions/{sid}/execs/{job['exec_id']}").json()
        assert final["status"] == "completed"
        assert final["result"]["stdout"] == outs  # the streamed bytes are the record's
        assert seen[-1][1]["result"] == final["result"]
        # cancel: the sleeping process group is killed and the evidence ends `cancelled`
        slow = c.post(f"/v1/sessions/{sid}/execs", json={
            "code": "import time\nprint('begun', flush=True)\ntime.sleep(60)",
            "wait": False, "timeout_s": 30}).json()
        time.sleep(1.0)
        polled = c.get(f"/v1/sessions/{sid}/execs/{slow['exec_id']}").json()
        assert polled["status"] == "running", polled
        t0 = time.monotonic()
        cancelled = c.delete(f"/v1/sessions/{sid}/execs/{slow['exec_id']}").json()
        assert time.monotonic() - t0 < 10
        assert cancelled["status"] == "cancelled"
        assert cancelled["result"]["error_code"] == "TOOL.EXECUTION_FAILED"
        envelope = cancelled["result"]["exec_id"]
        ends = [json.loads(x) for p in svc.state.rglob("*.jsonl")
                for x in p.read_text().splitlines() if envelope in x and '"end"' in x]
        assert any("cancel" in json.dumps(e) for e in ends), ends
        other = add_token(svc.state, "acme", "agent:frank")
        with svc.client(other) as o:
            _refused(o.get(f"/v1/sessions/{sid}/execs/{slow['exec_id']}"), 404,
                     "SERVICE.NOT_FOUND")
        kept = c.post(f"/v1/sessions/{sid}/run_code", json={"code": "y = 5",
                                                            "stateful": True}).json()
        assert kept["success"], kept
        sync = c.post(f"/v1/sessions/{sid}/execs", json={"code": "print(y - 1)",
                                                         "stateful": True}).json()
        assert sync["status"] == "completed"
        assert sync["result"]["stdout"] == "4\n"


def test_another_tenants_exec_and_run_code_cannot_read_a_session(svc: Service) -> None:
    """Session workspaces sit under the service's workspace root, beside the projects of
    `/sandbox/execs` and `/v1/run_code`: another tenant's calls there must not reach them."""
    owner = add_token(svc.state, "acme", "agent:gina")
    thief = add_token(svc.state, "evil", "agent:gina")
    with svc.client(owner) as c, svc.client(thief) as t:
        sid = c.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
        c.put(f"/v1/sessions/{sid}/files/secret.txt", content=b"s3cret-of-gina")
        found = [p for p in (svc.state / "workspace").rglob("secret.txt")]
        assert len(found) == 1
        where = found[0]
        rec = t.post("/sandbox/execs", json={"project_id": "steal", "exec": {
            "kind": "shell", "script": f"cat {where}; ls {where.parent}"}}).json()
        assert rec["exit_code"] not in (0, None), rec  # it ran, and cat failed
        stdout = t.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stdout.txt").text
        assert "s3cret" not in stdout
        assert "secret.txt" not in stdout
        ran = t.post("/v1/run_code", json={"session_id": "steal", "language": "shell",
                                            "code": f"cat {where}"}).json()
        assert ran["exit_code"] not in (0, None), ran
        assert "s3cret" not in ran["stdout"], ran
        mine = t.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
        took = t.post(f"/v1/sessions/{mine}/run_code", json={
            "language": "shell", "code": f"cat {where}"}).json()
        assert took["exit_code"] not in (0, None), took
        assert "s3cret" not in took["stdout"], took


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/sessions"), ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/s-" + "0" * 24), ("DELETE", "/v1/sessions/s-" + "0" * 24),
    ("POST", "/v1/sessions/s-" + "0" * 24 + "/run_code"),
    ("PUT", "/v1/sessions/s-" + "0" * 24 + "/files/a.txt"),
    ("GET", "/v1/sessions/s-" + "0" * 24 + "/execs/" + "0" * 32 + "/events")])
def test_every_session_endpoint_needs_a_token(svc: Service, method: str, path: str) -> None:
    with svc.client() as c:
        _refused(c.request(method, path, json={}), 401, "AUTH.UNAUTHENTICATED")


def test_docker_sessions_over_http_each_their_own_workspace(svc: Service) -> None:
    """Two docker sessions of one token (one was refused before), each its own workspace at
    its host path; an upload is there for the session's docker call, the other session sees
    nothing; the code's artifacts are downloadable; delete answers what it released."""
    alice = add_token(svc.state, "acme", "agent:docker")
    with svc.client(alice) as c:
        one = c.post("/v1/sessions", json={"backend": "docker"})
        two = c.post("/v1/sessions", json={"backend": "docker"})
        assert one.status_code == 201, one.text
        assert two.status_code == 201, two.text
        a, b = one.json()["session_id"], two.json()["session_id"]
        put = c.put(f"/v1/sessions/{a}/files/in.txt", content=b"uploaded")
        assert put.status_code in (200, 201), put.text
        code = ("import os\nd = os.environ['PE_ARTIFACTS_DIR']\n"
                "open(os.path.join(d, 'r.txt'), 'w').write(open('in.txt').read() + '!')\n"
                "print(os.getcwd())")
        ran = c.post(f"/v1/sessions/{a}/run_code", json={"code": code, "timeout_s": 60}).json()
        assert ran["success"], ran
        assert ran["sandbox_type"] == "docker", ran
        where = ran["stdout"].strip()
        assert where.endswith(f"/{a}/work"), where
        got = c.get(f"/v1/sessions/{a}/files/artifacts/r.txt")
        assert got.content == b"uploaded!", got.text
        seen = c.post(f"/v1/sessions/{b}/run_code",
                      json={"code": f"cat {where}/in.txt", "language": "shell"}).json()
        assert "uploaded" not in seen["stdout"], seen
        assert not seen["success"], seen
        for sid in (a, b):
            ended = c.delete(f"/v1/sessions/{sid}").json()
            assert ended["pool_released"] is True, ended
            assert ended["workspace_removed"] is True, ended


def test_binary_output_streams_within_a_small_multiple_of_its_cap(svc: Service) -> None:
    """Outsider attack 15: 1 MiB of binary output cost 7.9 MB on the wire, every undecodable
    byte sent as a six-character `\\ufffd` escape, in the streamed events and again in the end
    event's record. Both are UTF-8 on the wire; what is not UTF-8 is the replacement character
    (3 bytes), and the stream stays capped."""
    token = add_token(svc.state, "acme", "agent:grace")
    cap = 1 << 20
    with svc.client(token) as c:
        sid = c.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
        job = c.post(f"/v1/sessions/{sid}/execs", json={
            "code": f"head -c {2 * cap} /dev/urandom", "language": "shell",
            "wait": False}).json()
        texts: list[str] = []
        with c.stream("GET", f"/v1/sessions/{sid}/execs/{job['exec_id']}/events") as resp:
            raw = b"".join(resp.iter_bytes())
        end_at = raw.rindex(b"event: end\n")
        streamed_wire, end_wire = len(raw[:end_at]), len(raw[end_at:])
        # every line break of the data is escaped: even str.splitlines cuts no event
        for kind, data in _events(raw.decode("utf-8").splitlines()):
            if kind == "stdout":
                texts.append(str(data["text"]))
        streamed = "".join(texts)
        assert 0 < len(streamed) <= cap  # capped, in characters as in bytes
        assert "\ufffd" in streamed
        assert streamed_wire <= 3 * cap, streamed_wire
        assert end_wire <= 3 * cap, end_wire  # the final record, its stdout included
        c.delete(f"/v1/sessions/{sid}")
