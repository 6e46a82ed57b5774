"""An evidence record's JSON is rendered once and shared (issue 27), never stale: a copy with
other fields renders its own, and the kept rendering takes no part in equality."""

from __future__ import annotations

import copy
import json

from policy_engine.model.evidence import Digest, EvidenceEnd


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
