"""An evidence record's JSON is rendered once and shared (issue 27), never stale: a copy with
other fields renders its own, and the kept rendering takes no part in equality."""

from __future__ import annotations

import copy
import json
from typing import Any

from policy_engine.model import Limits, SideEffect, SideEffectRec, Usage
from policy_engine.model.evidence import Digest, EvidenceBegin, EvidenceEnd
from policy_engine.model.profile import RuleRef


def _end(status: str = "ok") -> EvidenceEnd:
    return EvidenceEnd(envelope_id="e-1", status=status,  # type: ignore[arg-type]
                       outputs_digest=Digest.of(b"x"), finished_at_ms=1)


def test_the_rendering_is_the_records_json_and_is_kept() -> None:
    end = _end()
    first = end.json_bytes()
    assert first == end.model_dump_json().encode()
    assert end.json_bytes() is first  # rendered once


def test_a_copy_renders_its_own_fields() -> None:
    end = _end()
    end.json_bytes()
    changed = end.model_copy(update={"status": "error"})
    assert json.loads(changed.json_bytes())["status"] == "error"
    assert json.loads(copy.copy(end).json_bytes())["status"] == "ok"
    assert json.loads(copy.deepcopy(end).json_bytes()) == json.loads(end.json_bytes())


def test_equality_ignores_the_kept_rendering() -> None:
    rendered, fresh = _end(), _end()
    rendered.json_bytes()
    assert rendered == fresh
    assert fresh == rendered
    assert rendered != _end("error")
    assert rendered != "not a record"


def test_past_the_table_bound_every_record_still_renders_its_own_json() -> None:
    # the kept renderings are a bounded table (cleared whole when full): a record whose
    # rendering was dropped renders again, never another record's bytes
    from policy_engine.model import evidence

    records = [_end() for _ in range(evidence._RENDERED_MAX * 2 + 3)]
    records = [r.model_copy(update={"envelope_id": f"e-{i}"}) for i, r in enumerate(records)]
    first = [r.json_bytes() for r in records]
    assert len(evidence._RENDERED) <= evidence._RENDERED_MAX
    for i, (record, rendered) in enumerate(zip(records, first, strict=True)):
        assert json.loads(rendered)["envelope_id"] == f"e-{i}"
        assert record.json_bytes() == record.model_dump_json().encode()


def test_a_kept_decision_part_renders_each_end_record_as_pydantic_does() -> None:
    """The end record's last six members are kept per rule and limits object; the rest is
    rendered per record: the bytes are ``model_dump_json``'s, whatever the head holds (a
    `"decision"` key in a side effect's meta included)."""
    rule = RuleRef(id="read", file="p.sbpolicy", line=2, column=1)
    limits = Limits(max_bytes_in=10, timeout_ms=5)
    heads: list[dict[str, Any]] = [
        {"status": "ok", "side_effects": (SideEffectRec(kind=SideEffect.READ, meta={
            "op": "fs.read", "path": "/w/\u00e9 \"q\"", "decision": "x,\"decision\":1"}),)},
        {"status": "error", "error_code": "QUOTA.BUDGET_EXCEEDED",
         "sandbox_error_kind": "quota", "budget_used": Usage(calls=1)},
        {"status": "denied", "sandbox_degraded": True, "sandbox_degrade_reason": "a; b"},
    ]
    tails: list[dict[str, Any]] = [
        {"decision": "allow", "rule": rule, "limits": limits, "timeout_ms": 5,
         "policy_version_hash": "h"},
        {"decision": "deny", "rule": None, "limits": limits, "reason": "no: https://x.test/"},
        {},
    ]
    for _ in range(3):  # first rendered whole, then from the kept part
        for i, head in enumerate(heads):
            for tail in tails:
                end = EvidenceEnd(envelope_id=f"e-{i}", outputs_digest=Digest.of(b"x"),
                                  finished_at_ms=i, sandbox_latency_ms=0.25,
                                  **{"status": "ok", **head, **tail})
                assert end.json_bytes() == end.model_dump_json().encode()


def test_a_begin_records_free_members_render_as_pydantic_does() -> None:
    for replay, shadow, notes in [
            (None, None, None),
            ({"v": 1, "op": {"kind": "fs.read", "path": "/\u00e9"}, "n": [1, 2.5, None, True],
              "f": float("nan"), "i": float("inf"), "s": "\"\\\n"}, {"decision": "deny"},
             {"risk": {"level": "low"}}),
            ({}, {}, {})]:
        begin = EvidenceBegin(envelope_id="e", tenant="t", subject_id="s", tool_name="x",
                              call_id="c", profile_hash="p", capability="fs.read:/a",
                              inputs_digest=Digest.of(b"a"), produced_at_ms=1,
                              policy_version_hash="h", replay=replay, shadow=shadow,
                              annotations=notes)
        assert begin.json_bytes() == begin.model_dump_json().encode()
