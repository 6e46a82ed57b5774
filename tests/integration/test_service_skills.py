"""`GET /skills` and `POST /skills/{id}/invoke` on the real server (`serve --skills`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.integration.mcp_fixtures import REPO
from tests.integration.service_server import Service, add_token, start

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("svc-skills")
    (root / "inputs").mkdir()
    (root / "inputs" / "hello.txt").write_text("hello\n")
    with start(root, "--skills", str(REPO / "skills")) as svc:
        yield svc


def _evidence(svc: Service, envelope: str) -> list[dict[str, object]]:
    """The end records of one envelope."""
    records = [json.loads(line) for p in svc.state.rglob("*.jsonl")
               for line in p.read_text().splitlines() if line.startswith("{")]
    return [r for r in records if r.get("type") == "end" and r.get("envelope_id") == envelope]


def test_list_skills_needs_a_token_and_shows_the_tools(service: Service) -> None:
    assert service.client().get("/skills").status_code == 401
    token = add_token(service.state, "acme", "agent:one")
    listed = service.client(token).get("/skills")
    assert listed.status_code == 200, listed.text
    skills = {s["id"]: s for s in listed.json()["skills"]}
    assert set(skills) == {"shell.run", "python.run", "http.fetch", "docs.browse",
                           "files.read"}
    assert skills["files.read"]["tool"] == "skill.files.read"
    assert skills["files.read"]["annotations"]["readOnlyHint"] is True
    assert skills["shell.run"]["side_effects"] == ["Process", "Read", "Write"]


def test_invoke_runs_the_guarded_op_with_evidence(service: Service) -> None:
    token = add_token(service.state, "acme", "agent:two")
    with service.client(token) as http:
        ran = http.post("/skills/shell.run/invoke", json={"inputs": {"script": "echo hi"}})
        assert ran.status_code == 200, ran.text
        body = ran.json()
        assert body["ok"] is True
        assert body["output"]["stdout"] == "hi\n"
        assert body["output"]["exit_code"] == 0
        assert _evidence(service, body["envelope_id"])

        # the service's policy permits no read of <root>/inputs: refused, with evidence
        denied = http.post("/skills/files.read/invoke",
                           json={"inputs": {"path": "inputs/hello.txt"}})
        assert denied.status_code == 403, denied.text
        err = denied.json()
        assert err["ok"] is False
        assert err["error"]["code"] == "SANDBOX.PERMISSION_DENY"
        ends = _evidence(service, err["envelope_id"])
        assert ends
        assert ends[0]["status"] == "denied"


def test_invoke_refuses_bad_inputs_with_a_json_pointer(service: Service) -> None:
    token = add_token(service.state, "acme", "agent:three")
    with service.client(token) as http:
        bad = http.post("/skills/files.read/invoke", json={"inputs": {"path": 5}})
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["code"] == "SCHEMA.VALIDATION_FAILED"
        assert bad.json()["error"]["pointer"] == "/inputs/path"
        assert [e["status"] for e in _evidence(service, bad.json()["envelope_id"])] == [
            "denied"]
        missing = http.post("/skills/shell.run/invoke", json={"inputs": {}})
        assert missing.status_code == 422
        assert missing.json()["error"]["pointer"] == "/inputs"
        secret = "s3cr3t-value"
        extra = http.post("/skills/shell.run/invoke",
                          json={"inputs": {"script": "true", "token": secret}})
        assert extra.status_code == 422
        assert secret not in extra.text
        assert http.post("/skills/no.such/invoke", json={}).status_code == 404
        assert http.post("/skills/Bad_Id/invoke", json={}).status_code == 400
        assert http.post("/skills/shell.run/invoke", json={"x": 1}).status_code == 422


def test_a_lone_surrogate_in_an_input_is_a_422_with_evidence(service: Service) -> None:
    """``"\\ud800"`` is valid JSON but no text: the schema let it through and the op's model
    refused it as an unhandled 500 (`UNKNOWN.INTERNAL`, no evidence, two tracebacks carrying
    the input in the server log, the keep-alive connection reset; outsider attack 15, F1)."""
    token = add_token(service.state, "acme", "agent:four")
    bodies = {"files.read": b'{"inputs":{"path":"inputs/\\ud800-marker"}}',
              "shell.run": b'{"inputs":{"script":"echo \\udfff-marker"}}',
              "http.fetch": b'{"inputs":{"url":"http://127.0.0.1:1/\\ud800-marker"}}'}
    with service.client(token) as http:
        for skill, body in bodies.items():
            bad = http.post(f"/skills/{skill}/invoke", content=body,
                            headers={"content-type": "application/json"})
            assert bad.status_code == 422, (skill, bad.text)
            assert bad.json()["error"]["code"] == "SCHEMA.VALIDATION_FAILED"
            assert bad.json()["error"]["pointer"].startswith("/inputs/"), bad.text
            assert [e["status"] for e in _evidence(service, bad.json()["envelope_id"])] == [
                "denied"]
        assert http.get("/skills").status_code == 200  # the same connection still serves
    log = (service.root / "serve.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "marker" not in log, log[-3000:]
