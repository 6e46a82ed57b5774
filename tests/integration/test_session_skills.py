"""Skills invoked in a session (issue 28 item 8, left open): `POST /v1/sessions/{id}/skills/
{skill}/invoke` runs the skill's op in the session's directory with the policy's `$SESSION`
resolved, on the real server under docs/sessions.md's recipe policy, on proc-bwrap and on
Docker sessions.

Before: skills had no session scope. `POST /skills/files.read/invoke` read beneath the
operator's `root_fs`, never a session's workspace, and `$SESSION` was unresolved for it, so
under the recipe a skill could not read what the session's exec wrote; there was no route.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policy_engine.client import Client, PolicyRefusal
from tests.integration.service_server import Service, add_token, start
from tests.integration.test_sessions_recipe import _policy

pytestmark = pytest.mark.integration
SKILLS = Path(__file__).resolve().parents[2] / "skills"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("session-skills")
    config = root / "engine.yaml"
    config.write_text("options:\n  docker: {mode: pool, pool_size: 1}\n")
    text = _policy().replace("{", "{{").replace("}", "}}")
    with start(root, "--security-mode", "permissive", "--config", str(config),
               "--skills", str(SKILLS), policy_text=text) as service:
        yield service
    assert "Traceback" not in (root / "serve.log").read_text()


def _evidence(state: Path, envelope: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in state.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("envelope_id") == envelope and rec.get("type") in ("begin", "end"):
                found[rec["type"]] = rec
    return found


def _invoke(c: httpx.Client, sid: str, skill: str, **inputs: Any) -> httpx.Response:
    return c.post(f"/v1/sessions/{sid}/skills/{skill}/invoke", json={"inputs": inputs})


def _refusal(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    refusal: dict[str, Any] = resp.json()["refusal"]
    assert refusal["code"] == code, refusal
    assert set(refusal) >= {"refused_by", "rule", "consent", "envelope_id", "location"}
    return refusal


@pytest.mark.parametrize("backend", ["proc-bwrap", "docker"])
def test_a_skill_reads_what_the_sessions_exec_wrote(svc: Service, backend: str) -> None:
    alice = add_token(svc.state, "acme", f"agent:alice-{backend}")
    with svc.client(alice) as c:
        sid = c.post("/v1/sessions", json={"backend": backend}).json()["session_id"]
        wrote = c.post(f"/v1/sessions/{sid}/execs",
                       json={"code": "printf 'from the exec' > out.txt",
                             "language": "shell"}).json()
        assert wrote["result"]["success"], wrote
        got = _invoke(c, sid, "files.read", path="work/out.txt")
        assert got.status_code == 200, got.text
        doc = got.json()
        assert doc["ok"], doc
        assert base64.b64decode(doc["output"]["bytes_b64"]) == b"from the exec"
        # its own decision and evidence, annotated with the session and the skill
        ev = _evidence(svc.state, doc["envelope_id"])
        assert ev["begin"]["tool_name"] == "files.read", ev
        assert ev["begin"]["annotations"]["session"] == sid, ev
        assert ev["begin"]["annotations"]["skill"] == "files.read", ev
        assert (ev["end"]["decision"], ev["end"]["status"]) == ("allow", "ok"), ev
        assert ev["end"]["rule"]["id"].endswith("session-files"), ev

        # another session of the same token: its own (empty) workspace, and no way out of it
        other = c.post("/v1/sessions", json={"backend": backend}).json()["session_id"]
        missing = _invoke(c, other, "files.read", path="work/out.txt")
        assert missing.status_code >= 400, missing.text
        assert "from the exec" not in missing.text
        escape = _invoke(c, other, "files.read", path=f"work/../../{sid}/work/out.txt")
        refused = _refusal(escape, 403, escape.json()["refusal"]["code"])
        assert refused["refused_by"] == "policy", refused
        assert "from the exec" not in escape.text

        # outside any session the recipe's `$SESSION/**` matches nothing (fail closed)
        plain = c.post("/skills/files.read/invoke", json={"inputs": {"path": "work/out.txt"}})
        assert plain.status_code >= 400, plain.text
        assert "from the exec" not in plain.text

    # another tenant, and another subject of the same tenant: 404, the one refusal shape
    for tenant, subject in (("globex", "agent:alice"), ("acme", "agent:bob")):
        with svc.client(add_token(svc.state, tenant, subject)) as c:
            refusal = _refusal(_invoke(c, sid, "files.read", path="work/out.txt"), 404,
                               "SERVICE.NOT_FOUND")
            assert refusal["refused_by"] == "service", refusal
    with svc.client(alice) as c:
        _refusal(_invoke(c, "s-" + "0" * 24, "files.read", path="work/out.txt"), 404,
                 "SERVICE.NOT_FOUND")
        _refusal(_invoke(c, sid, "no.such", path="work/out.txt"), 404, "SERVICE.NOT_FOUND")
        bad = _invoke(c, sid, "files.read", path="/etc/passwd")
        assert _refusal(bad, 422, "SCHEMA.VALIDATION_FAILED")["location"] == "/inputs/path"
        for s in (sid, other):
            assert c.delete(f"/v1/sessions/{s}").status_code == 200
        # an ended session: 404
        _refusal(_invoke(c, sid, "files.read", path="work/out.txt"), 404, "SERVICE.NOT_FOUND")


def test_a_container_skill_runs_in_a_docker_sessions_own_container(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:containers")
    with Client(svc.url, token) as c:
        s = c.create_session(backend="docker", ttl_s=300)
        c.upload(s.session_id, "data.txt", b"uploaded")
        ran = c.invoke_skill(s.session_id, "python.run",
                             {"code": "import os\nprint(os.getcwd())\n"
                                      "print(open('data.txt').read())\n"
                                      "open('made.txt', 'w').write('by the skill')"})
        assert ran.ok, ran
        cwd, text = ran.output["stdout"].split("\n")[:2]
        assert cwd.endswith(f"/{s.session_id}/work"), ran.output
        assert text == "uploaded", ran.output
        assert c.download(s.session_id, "made.txt") == b"by the skill"
        # a proc-bwrap session never runs a container skill elsewhere than a container
        b = c.create_session(backend="proc-bwrap", ttl_s=300)
        with pytest.raises(PolicyRefusal) as refused:
            c.invoke_skill(b.session_id, "python.run", {"code": "print(1)"})
        assert refused.value.refusal.code == "SANDBOX.CAPABILITY_BLOCKED"
        assert refused.value.refusal.refused_by == "backend"
        assert refused.value.refusal.rule is None
        # its evidence is written, and the answer names it (outsider attack 15, F4: null)
        envelope = refused.value.refusal.envelope_id
        assert envelope is not None
        assert any(envelope in p.read_text() for p in svc.state.rglob("*.jsonl"))
        for sid in (s.session_id, b.session_id):
            c.delete_session(sid)


def test_ending_the_session_cancels_a_running_skill(svc: Service) -> None:
    """A skill call counts as one of the session's running calls: delete kills it (its
    evidence ends before the answer) and says so."""
    token = add_token(svc.state, "acme", "agent:cancel")
    with svc.client(token) as c:
        sid = c.post("/v1/sessions", json={"backend": "docker"}).json()["session_id"]
    answered: list[httpx.Response] = []

    def invoke() -> None:
        with svc.client(token) as mine:
            answered.append(_invoke(mine, sid, "python.run",
                                    code="import time\nprint('up', flush=True)\n"
                                         "time.sleep(25)"))

    worker = threading.Thread(target=invoke)
    worker.start()
    deadline = time.monotonic() + 30
    while not any(r.get("type") == "begin" and (r.get("annotations") or {}).get("session") == sid
                  for r in _records(svc.state)):
        assert time.monotonic() < deadline, "the skill call never began"
        time.sleep(0.1)
    time.sleep(1.0)  # let it start its process
    with svc.client(token) as c:
        ended = c.delete(f"/v1/sessions/{sid}").json()
    worker.join(timeout=30)
    assert ended["calls_cancelled"] == 1, ended
    assert ended["calls_drained"] is True, ended
    assert answered, "the skill call never answered"
    doc = answered[0].json()
    assert answered[0].status_code >= 400, doc
    assert not doc.get("ok"), doc
    ev = _evidence(svc.state, doc["envelope_id"])
    assert ev["end"]["status"] != "ok", ev
    assert ev["end"]["sandbox_error_kind"] == "cancelled", ev


def _records(state: Path) -> list[dict[str, Any]]:
    found = []
    for path in state.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:  # a line still being written
                continue
    return found
