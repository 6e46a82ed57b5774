"""Snapshot of the error registry: every code's HTTP status, retryable flag and public message
template, and every diagnostic ID's severity and title. A change fails until the snapshot is
deliberately updated (`pytest conformance/test_registry.py --snapshot-update`).
"""

from __future__ import annotations

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from policy_engine.errors import DIAGNOSTICS, REGISTRY, ErrorCode


@pytest.fixture
def snapshot_json(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(JSONSnapshotExtension)


def test_error_codes_are_pinned(snapshot_json: SnapshotAssertion) -> None:
    view = {code.value: {"http_status": REGISTRY[code].http_status,
                         "retryable": REGISTRY[code].retryable,
                         "public_message": REGISTRY[code].public_message}
            for code in ErrorCode}
    assert set(view) == {c.value for c in REGISTRY}  # every code has a registry entry
    assert view == snapshot_json


def test_diagnostic_ids_are_pinned(snapshot_json: SnapshotAssertion) -> None:
    view = {d.id: {"severity": d.severity.value, "title": d.title}
            for d in DIAGNOSTICS.values()}
    assert view == snapshot_json
