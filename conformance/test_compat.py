"""Compatibility: error codes, enum members and evidence field types are add-only (seed 000 §13).

Fails naming anything in conformance/compat/baseline.json that was removed, renamed or retyped.
Additions pass, with a warning saying how to record them in the baseline.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

from policy_engine.conformance.compat import Surface, compare, merge, surface

BASELINE = Path(__file__).parent / "compat" / "baseline.json"


def baseline() -> Surface:
    data: Surface = json.loads(BASELINE.read_text(encoding="utf-8"))
    return data


def test_public_surface_keeps_everything_in_the_baseline() -> None:
    breaks, added = compare(baseline(), surface())
    assert not breaks, ("the public surface lost or changed entries (add-only, seed 000 §13):\n"
                        + "\n".join(breaks))
    if added:
        warnings.warn("new public surface not yet in conformance/compat/baseline.json; record it "
                      "with `python3 conformance/compat/update_baseline.py`:\n"
                      + "\n".join(added), stacklevel=1)


def test_baseline_covers_every_error_code_and_evidence_record() -> None:
    base = baseline()
    assert set(base["error_codes"]) >= {"PERMISSION_DENY", "TIMEOUT", "EXECUTION_FAILED"}
    assert {"Severity", "OpKind", "NetworkMode", "EvidenceEnd.status"} <= set(base["enums"])
    assert base["evidence_fields"]["EvidenceEnd.sandbox_timed_out"] == "boolean"
    assert base["evidence_fields"]["EvidenceBegin.inputs_digest.size"] == "integer"


def doctored() -> Surface:
    """The current surface with one break of each kind, as a careless change would make."""
    now = copy.deepcopy(surface())
    now["error_codes"]["TIMED_OUT"] = now["error_codes"].pop("TIMEOUT")  # a rename
    del now["enums"]["Severity"]["NOTE"]  # a removed member
    now["enums"]["NetworkMode"]["ON"] = "open"  # a changed value
    now["evidence_fields"]["EvidenceEnd.sandbox_latency_ms"] = "integer"  # a type change
    del now["evidence_fields"]["EvidenceBegin.call_id"]  # a removed field
    return now


def test_checker_names_each_kind_of_break() -> None:
    breaks, _added = compare(baseline(), doctored())
    text = "\n".join(breaks)
    assert "error code ErrorCode.TIMEOUT = 'LLM.TIMEOUT' was removed (renamed to " \
           "ErrorCode.TIMED_OUT?)" in text
    assert "enum member Severity.NOTE = 'note' was removed or renamed" in text
    assert "enum member NetworkMode.ON changed value 'on' -> 'open'" in text
    assert "evidence field EvidenceEnd.sandbox_latency_ms changed type null|number -> " \
           "integer" in text
    assert "evidence field EvidenceBegin.call_id (string) was removed or renamed" in text
    assert len(breaks) == 5


def test_additions_pass_and_merge_only_adds() -> None:
    now = copy.deepcopy(surface())
    now["error_codes"]["RATE_LIMITED"] = "QUOTA.RATE_LIMITED"
    now["enums"]["OpKind"]["KV_GET"] = "kv.get"
    breaks, added = compare(baseline(), now)
    assert breaks == []
    assert "error code ErrorCode.RATE_LIMITED = 'QUOTA.RATE_LIMITED'" in added
    assert "enum member OpKind.KV_GET = 'kv.get'" in added
    merged = merge(baseline(), doctored())  # a doctored surface never shrinks the baseline
    assert merged["error_codes"]["TIMEOUT"] == "LLM.TIMEOUT"
    assert merged["enums"]["Severity"]["NOTE"] == "note"
    assert merged["evidence_fields"]["EvidenceEnd.sandbox_latency_ms"] == "null|number"
