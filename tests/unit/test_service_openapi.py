"""The committed OpenAPI document (docs/openapi.json) is the one the service serves."""

from __future__ import annotations

import json
from pathlib import Path

from policy_engine.service.openapi import openapi_document, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_committed_openapi_document_matches_the_service() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/openapi.json is stale: run `python3 scripts/gen_openapi.py`")


def test_document_is_openapi_3_1_with_every_endpoint_and_bearer_auth() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/v1/decide", "/v1/ops", "/v1/run_code", "/sandbox/execs", "/sandbox/execs/{exec_id}",
        "/sandbox/execs/{exec_id}/artifacts", "/sandbox/execs/{exec_id}/artifacts/{name}",
        "/sandbox/health", "/skills", "/skills/{skill_id}/invoke",
        "/v1/sessions", "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/extend",
        "/v1/sessions/{session_id}/events", "/v1/sessions/{session_id}/run_code",
        "/v1/sessions/{session_id}/interpreter/restart",
        "/v1/sessions/{session_id}/files", "/v1/sessions/{session_id}/files/{path}",
        "/v1/sessions/{session_id}/execs", "/v1/sessions/{session_id}/execs/{exec_id}",
        "/v1/sessions/{session_id}/execs/{exec_id}/events",
        "/v1/sessions/{session_id}/skills/{skill_id}/invoke"}
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    # health is the one endpoint without a token
    assert "security" not in doc["paths"]["/sandbox/health"]["get"]
    assert all("security" in op for path, ops in doc["paths"].items()
               if path != "/sandbox/health" for op in ops.values())
    # every documented error is the one JSON error shape
    assert "ErrorBody" in json.dumps(doc["paths"]["/v1/ops"]["post"]["responses"]["401"])


def test_ops_and_decide_declare_their_outcomes() -> None:
    """No bare `object`: a generated client reads a denial's `result`, `refusal` and
    `envelope_id` from the declared run document (issue 28 item 6)."""
    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    ops = doc["paths"]["/v1/ops"]["post"]["responses"]
    decide = doc["paths"]["/v1/decide"]["post"]["responses"]
    ok = ops["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/OpDocument"}
    denied = ops["403"]["content"]["application/json"]["schema"]
    refs = {alt["$ref"].rsplit("/", 1)[-1] for alt in denied["anyOf"]}
    assert refs == {"OpDocument", "ErrorBody"}
    assert {"result", "envelope_id", "refusal", "error", "decision", "evidence"} <= set(
        schemas["OpDocument"]["properties"])
    answers = decide["200"]["content"]["application/json"]["schema"]["anyOf"]
    assert {alt["$ref"].rsplit("/", 1)[-1] for alt in answers} == {"DecideCompact",
                                                                    "DecideDocument"}
    for name in ("DecideCompact", "DecideDocument"):  # the compact answer, or explain=full
        assert schemas[name]["properties"]["decision"]["enum"] == ["allow", "deny"]
    for path in ("/v1/ops", "/v1/decide"):
        for resp in doc["paths"][path]["post"]["responses"].values():
            for media in resp.get("content", {}).values():
                assert media["schema"] != {"type": "object"}
