"""Conformance: snapshots pin every example's decision, error code, HTTP status and rule.

A change in any refusal's code or in the rule that decides it fails here until the snapshot is
deliberately updated (`pytest conformance --snapshot-update`); unused snapshots fail too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.explain import explain
from policy_engine.explain.request import load_request, resolve_fixture

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = sorted((ROOT / "examples" / "requests").glob("*.json"))
POLICYSET = compile_files([ROOT / "examples" / "policies" / "org.sbpolicy"])


@pytest.fixture
def snapshot_json(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(JSONSnapshotExtension)


def pinned_view(request_path: Path) -> dict[str, Any]:
    """The part of a decision that is a public contract (no machine-dependent hashes)."""
    request = load_request(request_path)
    manifest = load_manifest(resolve_fixture(request_path, request.manifest, "manifest"))
    grant = load_grant(resolve_fixture(request_path, request.grant, "grant"))
    d = explain(POLICYSET, manifest, grant, request).decision
    rule = None
    if d.rule is not None:
        rule = {"id": d.rule.id, "file": Path(d.rule.file).name, "line": d.rule.line,
                "column": d.rule.column}
    return {
        "decision": d.decision,
        "code": d.code,
        "http_status": d.http_status,
        "reason": d.reason,
        "rule": rule,
        "trace": [f"{s.node}:{s.outcome}" for s in d.trace or ()],
    }


@pytest.mark.parametrize("request_path", REQUESTS, ids=[p.stem for p in REQUESTS])
def test_decision_is_pinned(request_path: Path, snapshot_json: SnapshotAssertion) -> None:
    view = pinned_view(request_path)
    expect = json.loads(request_path.read_text())["expect"]
    assert view["code"] == expect["code"]
    assert view == snapshot_json
