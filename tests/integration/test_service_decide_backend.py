"""Outsider round 5 F08: the service's dry run `POST /v1/decide` answers as `POST /v1/ops` on the
same server does. It answered `allow` (only listing `backend_requires`) for a named profile with
`isolation gvisor` on proc-bwrap, which `/v1/ops` refuses SANDBOX.CAPABILITY_BLOCKED; it now makes
the run's backend choice with the server's engine config, in the ASGI fast path
(`application/json`) and in the FastAPI route (any other content type), like `explain --config`.
A real `policy-engine serve` subprocess on a loopback port; nothing starts in a sandbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service_server import add_token, start

pytestmark = pytest.mark.integration

POLICY = """policy "f08/decide" version "1.0.0"
profile "gv" {{
  network off
  isolation gvisor
}}
permit "py" proc.exec tool "python3"
permit "rd" fs.read paths ["{root}/**"]
permit "net" net.http hosts ["example.com"] methods ["GET"]
require consent when `false`
"""

PERMS = [{"kind": "proc.exec", "tool": "python3"},
         {"kind": "net.http", "hosts": ["example.com"], "methods": ["GET"]}]
FAST, ROUTE = "application/json", "application/json; charset=utf-8"  # the route takes the 2nd


def _serve(root: Path, backend: str) -> tuple[Any, str]:
    state = root / "state"
    state.mkdir(parents=True)
    config = root / "engine.yaml"
    config.write_text(f"state_dir: {state}\nmode: compat\nbackends: {{proc.exec: {backend}}}\n")
    tools = []
    for name, extra in (("plain", {}), ("gv", {"profile": "gv"}),
                        ("rest", {"network": "restricted"})):
        path = root / f"{name}.json"
        path.write_text(json.dumps({
            "name": name, "version": "1.0.0", "permissions": PERMS, "side_effects": ["Process"],
            "safety_class": "Low", **extra}))
        tools += ["--manifest", str(path)]
    token = add_token(state, "acme", "agent:x")
    return start(root, "--config", str(config), *tools, policy_text=POLICY), token


def _body(tool: str) -> dict[str, Any]:
    return {"op": {"kind": "proc.exec", "tool": "python3", "args": ["-c", "print(1)"]},
            "manifest": tool,
            "grant": {"tenant": "acme", "subject_id": "agent:x", "tool_name": tool,
                      "call_id": "c1", "expires_at": 4102444800000, "capabilities": PERMS}}


def _post(client: httpx.Client, path: str, body: dict[str, Any],
          ctype: str = FAST) -> tuple[int, dict[str, Any]]:
    resp = client.post(path, content=json.dumps(body), headers={"content-type": ctype})
    return resp.status_code, resp.json()


def _same_answer(client: httpx.Client, tool: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """/v1/decide's full document (fast path and route agree, and the compact answer says
    the same) and /v1/ops's answer for ``tool``."""
    fast_status, fast = _post(client, "/v1/decide?explain=full", _body(tool))
    route_status, route = _post(client, "/v1/decide?explain=full", _body(tool), ROUTE)
    assert fast_status == route_status == 200, (fast, route)
    assert fast == route
    _, compact = _post(client, "/v1/decide", _body(tool))
    for field in ("decision", "code", "reason", "rule", "limits", "backend_requires"):
        assert compact[field] == fast[field], field
    _, ran = _post(client, "/v1/ops", _body(tool))
    return fast, ran


@pytest.mark.parametrize(("backend", "tool", "why"), [
    ("proc-bwrap", "gv", "cannot provide `isolation:gvisor`"),
    ("proc-unshare", "rest", "cannot restrict the network to the policy proxy"),
])
def test_decide_denies_what_ops_refuses_on_the_same_server(tmp_path: Path, backend: str,
                                                           tool: str, why: str) -> None:
    service, token = _serve(tmp_path, backend)
    with service, service.client(token) as client:
        said, ran = _same_answer(client, tool)
        assert said["decision"] == "deny", said
        assert said["code"] == "SANDBOX.CAPABILITY_BLOCKED", said
        assert why in said["reason"], said
        assert said["trace"][-1]["node"] == "backend", said["trace"]
        assert ran["error"]["code"] == said["code"], ran
        assert ran["decision"]["decision"] == "deny", ran
        assert ran["decision"]["reason"] == said["reason"]


def test_decide_allows_what_ops_runs(tmp_path: Path) -> None:
    service, token = _serve(tmp_path, "proc-bwrap")
    with service, service.client(token) as client:
        said, ran = _same_answer(client, "plain")
        assert said["decision"] == "allow", said
        step = said["trace"][-1]
        assert (step["node"], step["outcome"]) == ("backend", "pass"), said["trace"]
        assert "backend `proc-bwrap`" in step["detail"]
        assert ran["decision"]["decision"] == "allow", ran
        assert ran["result"]["ok"] is True, ran
        assert ran["result"]["out"]["stdout"].strip() == "1", ran
