"""Attack 36: a policy whose paths cover the engine's own state directory hands it to the agent.

`serve --state-dir ROOT/state --root-fs ROOT` with `permit fs.read, fs.write paths ["ROOT/**"]`
(an operator permitting "the project" that holds `./var`): `/v1/ops` reads the evidence HMAC
key (docs/operations.md, Evidence: "never written into a record", 0600 in a 0700 directory)
and the token database, and overwrites the evidence log. docs/sandbox-config.md keeps the
state directory out of every sandboxed run for this reason ("a command could otherwise delete
or rewrite the record of what it did"); the guard of `/v1/ops` should refuse it too.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.service_server import Service, add_token, grant, start

pytestmark = pytest.mark.integration

POLICY = """policy "svc/project" version "1.0.0"
permit "project" fs.read, fs.write, fs.list  paths ["{root}/**"]
require consent when `profile.safety == "High"`
"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("statedir")
    (root / "writer.json").write_text(json.dumps({
        "name": "writer", "version": "1.0.0", "side_effects": ["Read", "Write"],
        "permissions": [{"kind": k, "paths": [f"{root}/**"]}
                        for k in ("fs.read", "fs.write", "fs.list")]}))
    with start(root, "--manifest", str(root / "writer.json"), policy_text=POLICY) as service:
        yield service
    assert "Traceback" not in (root / "serve.log").read_text()


@pytest.fixture(scope="module")
def token(svc: Service) -> str:
    return add_token(svc.state, "acme", "agent:alice")


def _op(svc: Service, token: str, op: dict[str, object]) -> httpx.Response:
    caps = [{"kind": k, "paths": [f"{svc.root}/**"]} for k in ("fs.read", "fs.write", "fs.list")]
    body = {"op": op, "manifest": "writer",
            "grant": grant("acme", "agent:alice", svc.root, tool_name="writer",
                           capabilities=caps)}
    return httpx.post(f"{svc.url}/v1/ops", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {token}"})


def test_the_evidence_key_and_token_store_are_not_readable(svc: Service, token: str) -> None:
    # the open project permit itself works: a file of the project is read
    assert _op(svc, token, {"kind": "fs.read",
                            "path": f"{svc.root}/data/hello.txt"}).status_code == 200
    for name in ("keys/evidence-hmac.key", "tokens.sqlite"):
        resp = _op(svc, token, {"kind": "fs.read", "path": f"{svc.state}/{name}"})
        assert resp.status_code == 403, f"{name}: {resp.text[:300]}"
        out = resp.json().get("result", {}).get("out") or {}
        assert "bytes_b64" not in out, name


def test_the_evidence_log_cannot_be_overwritten(svc: Service, token: str) -> None:
    log = svc.state / "evidence" / "evidence.jsonl"
    resp = _op(svc, token, {"kind": "fs.write", "path": str(log),
                            "bytes_b64": base64.b64encode(b"{}\n").decode(), "overwrite": True})
    refused = resp.status_code == 403
    # observed when allowed: the write replaced the file, so the engine's appends go on to the
    # unlinked old one and every later call's evidence is missing from the log
    later = _op(svc, token, {"kind": "fs.read", "path": f"{svc.root}/data/hello.txt"})
    assert later.status_code == 200, later.text[:300]
    assert refused, resp.text[:300]
    envelope, deadline = later.json()["envelope_id"], time.monotonic() + 10
    while envelope not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)  # a record may reach the file just after the answer
    assert envelope in log.read_text()


def _post(svc: Service, token: str, route: str, op: dict[str, object]) -> httpx.Response:
    caps = [{"kind": k, "paths": [f"{svc.root}/**"]} for k in ("fs.read", "fs.write", "fs.list")]
    body = {"op": op, "manifest": "writer",
            "grant": grant("acme", "agent:alice", svc.root, tool_name="writer",
                           capabilities=caps)}
    return httpx.post(f"{svc.url}{route}", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {token}"})


def test_the_refusal_names_the_builtin_rule_and_decide_gives_the_same(svc: Service,
                                                                      token: str) -> None:
    op = {"kind": "fs.read", "path": f"{svc.state}/tokens.sqlite"}
    ran = _post(svc, token, "/v1/ops", op).json()
    said = _post(svc, token, "/v1/decide?explain=full", op).json()
    assert ran["error"]["code"] == "SANDBOX.CAPABILITY_BLOCKED", ran
    assert ran["decision"]["rule"]["id"] == "builtin:engine-state", ran
    assert said["decision"] == "deny", said
    for field in ("code", "reason", "rule"):
        assert said[field] == ran["decision"][field], field
    assert any(s["node"] == "forbid" and (s.get("rule") or {}).get("id") ==
               "builtin:engine-state" for s in said["trace"]), said["trace"]


def test_a_symlink_into_the_state_dir_does_not_get_around_it(svc: Service, token: str) -> None:
    link = svc.root / "innocent"
    if not link.is_symlink():
        link.symlink_to(svc.state)
    for op in ({"kind": "fs.read", "path": f"{link}/keys/evidence-hmac.key"},
               {"kind": "fs.write", "path": f"{link}/keys/evidence-hmac.key",
                "bytes_b64": base64.b64encode(b"x").decode(), "overwrite": True},
               {"kind": "fs.list", "path": f"{link}/keys"}):
        for route in ("/v1/ops", "/v1/decide"):
            resp = _post(svc, token, route, op)
            body = resp.json()
            code = body["error"]["code"] if route == "/v1/ops" else body["code"]
            assert code == "SANDBOX.CAPABILITY_BLOCKED", (route, op["kind"], body)
    assert (svc.state / "keys" / "evidence-hmac.key").read_bytes() != b"x"


def test_a_listing_of_the_project_leaves_the_state_dir_out(svc: Service, token: str) -> None:
    resp = _post(svc, token, "/v1/ops", {"kind": "fs.list", "path": str(svc.root), "depth": 3})
    assert resp.status_code == 200, resp.text[:300]
    listed = json.dumps(resp.json()["result"]["out"])
    assert "hello.txt" in listed  # the project is listed
    for name in ("tokens.sqlite", "evidence-hmac.key", "evidence.jsonl"):
        assert name not in listed, name
    refused = _post(svc, token, "/v1/ops", {"kind": "fs.list", "path": str(svc.state)})
    assert refused.status_code == 403, refused.text[:300]


def test_the_workspaces_under_the_state_dir_stay_open(svc: Service, token: str) -> None:
    # serve keeps its exec and session workspaces in STATE/workspace: calls act there
    target = svc.state / "workspace" / "attack36" / "note.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    resp = _post(svc, token, "/v1/ops", {"kind": "fs.write", "path": str(target),
                                         "bytes_b64": base64.b64encode(b"ok").decode()})
    assert resp.status_code == 200, resp.text[:300]
    assert target.read_bytes() == b"ok"
