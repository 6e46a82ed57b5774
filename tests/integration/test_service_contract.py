"""The contract mismatches schemathesis found (fuzz round 2, issue 32.11), each against the real
server and the committed docs/openapi.json: a boolean taken as a limit, a duplicate input
answered with a status the document does not promise for well-formed data, a 422 body with a
field `ErrorBody` did not allow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.integration.service_server import Service, add_token, serving

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC = json.loads((ROOT / "docs" / "openapi.json").read_text())


def _schema(name: str) -> Draft202012Validator:
    return Draft202012Validator({**DOC["components"]["schemas"][name],
                                 "components": DOC["components"]})


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("contract"), "--skills", str(ROOT / "skills")) as s:
        yield s


@pytest.fixture(scope="module")
def token(svc: Service) -> str:
    return add_token(svc.state, "acme", "agent:contract")


def _exec(svc: Service, token: str, body: dict[str, Any]) -> Any:
    with svc.client(token) as c:
        return c.post("/sandbox/execs", json=body)


def test_a_boolean_is_not_a_limit(svc: Service, token: str) -> None:
    resp = _exec(svc, token, {"project_id": "c", "exec": {"kind": "shell", "script": "true"},
                              "policy_overrides": {"limits": {"max_stdout_bytes": False}}})
    assert resp.status_code == 422, resp.text
    assert "a limit is a number, not true/false" in resp.text


def test_a_duplicate_input_is_a_documented_conflict(svc: Service, token: str) -> None:
    resp = _exec(svc, token, {"project_id": "c", "exec": {"kind": "shell", "script": "true"},
                              "inputs": [{"path": "a.txt", "content": "1"},
                                         {"path": "./a.txt", "content": "2"}]})
    assert resp.status_code == 409, resp.text
    assert resp.json()["error"]["code"] == "SERVICE.CONFLICT"
    responses = DOC["paths"]["/sandbox/execs"]["post"]["responses"]
    assert "409" in responses


def test_a_refused_skill_input_body_matches_error_body(svc: Service, token: str) -> None:
    with svc.client(token) as c:
        resp = c.post("/skills/files.read/invoke", json={"inputs": {"path": "/etc/passwd"}})
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert "envelope_id" in body
    assert body["error"]["pointer"] == "/inputs/path"
    assert [e.message for e in _schema("ErrorBody").iter_errors(body)] == []
