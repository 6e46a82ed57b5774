"""The console's evidence index and approval queue, on real files and databases."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from policy_engine.confirm.queue import ApprovalQueue, ConsoleConfirmation, LateAnswer
from policy_engine.confirm.services import ConsentRequest
from policy_engine.console.forms import BadInput, call_query, when
from policy_engine.console.index import EvidenceIndex, JsonlSource, SqliteSource
from policy_engine.evidence.chain import chained, next_link


def _records(n: int, tenant: str = "acme", start: int = 1_700_000_000_000) -> list[dict]:
    out = []
    for i in range(n):
        env = f"e{i:05d}"
        out.append({"type": "begin", "envelope_id": env, "tenant": tenant,
                    "subject_id": f"agent:{i % 3}", "tool_name": "reader",
                    "capability": f"fs.read:/data/{i}.txt", "produced_at_ms": start + i})
        out.append({"type": "end", "envelope_id": env, "status": "ok" if i % 2 else "denied",
                    "decision": "allow" if i % 2 else "deny",
                    "error_code": None if i % 2 else "SANDBOX.CAPABILITY_BLOCKED",
                    "rule": {"id": "r1" if i % 2 else "no-secret", "file": "/p.sbpolicy",
                             "line": 2, "column": 1},
                    "finished_at_ms": start + i + 1, "sandbox_backend": "fs",
                    "sandbox_latency_ms": float(i % 10)})
    return out


def _write_chained(path: Path, records: list[dict]) -> list[bytes]:
    lines: list[bytes] = []
    last: bytes | None = None
    for rec in records:
        seq, prev = next_link(last)
        raw = chained(json.dumps(rec, separators=(",", ":")).encode(), seq, prev)
        lines.append(raw)
        last = raw
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def test_pages_are_newest_first_filtered_and_continue_where_they_stopped(
        tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    _write_chained(log, _records(120))
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    assert index.sync() == 240
    first = index.page({"tenant": "acme"}, size=50)
    assert [r["envelope_id"] for r in first.rows][:2] == ["e00119", "e00118"]
    second = index.page({"tenant": "acme"}, cursor=first.next_cursor, size=50)
    third = index.page({"tenant": "acme"}, cursor=second.next_cursor, size=50)
    seen = [r["envelope_id"] for p in (first, second, third) for r in p.rows]
    assert len(seen) == len(set(seen)) == 120
    assert third.next_cursor is None
    denied = index.page({"decision": "deny", "code": "SANDBOX.CAPABILITY_BLOCKED"}, size=200)
    assert len(denied.rows) == 60
    assert {r["rule_id"] for r in denied.rows} == {"no-secret"}
    assert index.page({"tenant": "globex"}).rows == []
    assert len(index.page({}, since=1_700_000_000_100, size=200).rows) == 20


def test_a_sync_reads_only_what_was_added_and_waits_for_a_torn_tail(tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    _write_chained(log, _records(3))
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    assert index.sync() == 6
    assert index.sync() == 0
    with log.open("ab") as fh:  # a record half written: not read until its newline arrives
        fh.write(b'{"type":"begin","envelope_id":"late"')
    assert index.sync() == 0
    with log.open("ab") as fh:
        fh.write(b',"tenant":"acme","produced_at_ms":5}\n')
    assert index.sync() == 1
    assert index.call("late", None) is not None


def test_hostile_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    deep = b"[" * 5000 + b"]" * 5000
    log.write_bytes(deep + b"\nnot json\n" + b"x" * (1 << 21) + b"\n"
                    + json.dumps(_records(1)[0]).encode() + b"\n")
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    index.sync()
    assert index.unreadable() == 3
    assert index.call("e00000", None) is not None


def test_a_calls_page_rereads_its_records_and_sees_tampering(tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    lines = _write_chained(log, _records(3))
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    index.sync()
    assert index.call("e00000", None)["chain"] == "intact"
    assert index.call("e00002", None)["chain"] == "unchecked"  # the tail: nothing follows
    # edit the first call's end record in place (same length, so offsets hold)
    edited = lines[1].replace(b'"deny"', b'"DENY"')
    log.write_bytes(log.read_bytes().replace(lines[1], edited))
    found = index.call("e00000", None)
    assert found["chain"] == "tampered"
    assert found["end"]["decision"] == "DENY"  # what the log says now, not the index


def test_a_tenant_scope_hides_other_tenants_calls(tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    _write_chained(log, _records(2, "acme") + [
        {**r, "envelope_id": "g" + r["envelope_id"], "tenant": "globex"}
        for r in _records(1, "globex")])
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    index.sync()
    assert index.call("ge00000", "acme") is None
    assert index.call("ge00000", "globex") is not None
    assert index.call("ge00000", None) is not None  # an admin's view


def test_the_sqlite_sink_is_read_by_sequence(tmp_path: Path) -> None:
    db_path = tmp_path / "evidence.sqlite"
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE evidence_records (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
               "envelope_id TEXT, type TEXT, record TEXT)")
    last: bytes | None = None
    for rec in _records(4):
        seq, prev = next_link(last)
        raw = chained(json.dumps(rec).encode(), seq, prev)
        db.execute("INSERT INTO evidence_records (envelope_id, type, record) VALUES (?, ?, ?)",
                   (rec["envelope_id"], rec["type"], raw.decode()))
        last = raw
    db.commit()
    index = EvidenceIndex(tmp_path / "index.sqlite", [SqliteSource(db_path)])
    assert index.sync() == 8
    assert index.call("e00001", None)["chain"] == "intact"
    db.execute("UPDATE evidence_records SET record = replace(record, 'agent:1', 'agent:X') "
               "WHERE envelope_id = 'e00001' AND type = 'begin'")
    db.commit()
    db.close()
    assert index.call("e00001", None)["chain"] == "tampered"


def test_stats_count_refusals_and_latency_percentiles(tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    _write_chained(log, _records(100))
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    index.sync()
    stats = index.stats({})
    assert stats["by_code"] == [{"code": "SANDBOX.CAPABILITY_BLOCKED", "calls": 50}]
    assert stats["by_rule"] == [{"rule": "no-secret", "calls": 50}]
    (fs,) = stats["latency"]
    assert fs["calls"] == 100
    assert fs["p50"] == 5.0
    assert fs["p99"] == 9.0
    assert sum(p["calls"] for p in stats["series"]) == 100


def _question(rid: str, tenant: str = "acme") -> ConsentRequest:
    return ConsentRequest(request_id=rid, tenant=tenant, subject_id="agent:a", tool_name="t",
                          call_id="c", capability="fs.write:/w/x", op={"kind": "fs.write"},
                          reason="consent required", requested_at_ms=0)


def test_an_answer_after_the_call_stopped_waiting_is_refused(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path / "approvals.sqlite")
    service = ConsoleConfirmation(queue, timeout_s=0.3)
    answer = service.confirm(_question("q1"))
    assert not answer.approved
    assert answer.detail.startswith("timed_out")
    with pytest.raises(LateAnswer):
        queue.answer("q1", approved=True, approver="late", note="too late", valid_for_ms=1000,
                     tenant=None)
    row = queue.get("q1", None)
    assert row is not None
    assert row.status == "timed_out"
    assert row.approver is None


def test_an_answer_in_time_reaches_the_waiting_call(tmp_path: Path) -> None:
    queue = ApprovalQueue(tmp_path / "approvals.sqlite")
    service = ConsoleConfirmation(queue, timeout_s=20)
    got = []
    thread = threading.Thread(target=lambda: got.append(service.confirm(_question("q2"))))
    thread.start()
    deadline = time.monotonic() + 10
    while queue.pending_count("acme") == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(LateAnswer):  # another tenant's approver cannot answer it
        queue.answer("q2", approved=True, approver="x", note="n", valid_for_ms=1,
                     tenant="globex")
    queue.answer("q2", approved=True, approver="alex", note="ok: ticket 7",
                 valid_for_ms=60_000, tenant="acme")
    thread.join(5)
    assert got[0].approved
    assert got[0].approver == "alex"  # recorded as `console:alex` (mode:approver)
    assert got[0].valid_for_ms == 60_000
    with pytest.raises(LateAnswer):  # answered once: a second answer is refused
        queue.answer("q2", approved=False, approver="bob", note="no", valid_for_ms=0,
                     tenant=None)


def test_query_fields_are_validated() -> None:
    assert call_query({"tenant": "acme", "size": "20"}).size == 20
    assert when("2026-11-29T10:30", "since") == 1795948200000  # date -u -d ... +%s
    for bad in ({"size": "5"}, {"decision": "maybe"}, {"cursor": "<x>"}, {"nope": "1"},
                {"tenant": "a\x00b"}, {"since": "2026-02-30"}, {"until": "yesterday"}):
        with pytest.raises(BadInput):
            call_query(bad)


def test_a_record_without_a_link_among_linked_ones_is_tampered(tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    lines = _write_chained(log, _records(2))
    forged = {"type": "begin", "envelope_id": "forged", "tenant": "acme",
              "subject_id": "agent:nochain", "produced_at_ms": 5}
    # appended without a chain link, then a real record chained after it
    raw = json.dumps(forged).encode()
    seq, prev = next_link(raw)
    after = chained(json.dumps({**_records(3)[4], "envelope_id": "later"}).encode(), seq, prev)
    log.write_bytes(b"".join(x + b"\n" for x in [*lines, raw, after]))
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    index.sync()
    assert index.call("forged", None)["chain"] == "tampered"
    # and a log written before chaining, followed by the first linked record, is unchecked
    old = tmp_path / "old.jsonl"
    first = json.dumps(_records(1)[0]).encode()
    seq, prev = next_link(first)
    old.write_bytes(first + b"\n" + chained(json.dumps(_records(1)[1]).encode(), seq, prev)
                    + b"\n")
    assert next_link(first)[0] == 0
    index = EvidenceIndex(tmp_path / "old-index.sqlite", [JsonlSource(old)])
    index.sync()
    assert index.call("e00000", None)["begin"]["tenant"] == "acme"


def test_a_second_record_for_one_envelope_never_replaces_the_first(tmp_path: Path) -> None:
    log = tmp_path / "evidence.jsonl"
    records = _records(2)
    impostor = {**records[0], "tenant": "globex", "subject_id": "agent:fake"}
    _write_chained(log, [*records, impostor])
    index = EvidenceIndex(tmp_path / "index.sqlite", [JsonlSource(log)])
    index.sync()
    call = index.call("e00000", None)
    assert call["tenant"] == "acme"  # the first record's call, not the impostor's
    assert call["chain"] == "tampered"
    assert index.call("e00000", "globex") is None


def test_the_queue_stops_taking_answers_before_the_call_stops_waiting(tmp_path: Path) -> None:
    """An answer the queue takes is never late for the call (outsider round 13, M1: a yes in
    the last moment was recorded as approved while the call was refused as late)."""
    queue = ApprovalQueue(tmp_path / "approvals.sqlite")
    service = ConsoleConfirmation(queue, timeout_s=2.0)  # answers taken for 1 s of the 2
    got = []
    thread = threading.Thread(target=lambda: got.append(service.confirm(_question("q3"))))
    thread.start()
    while queue.pending_count("acme") == 0:
        time.sleep(0.02)
    time.sleep(1.2)
    with pytest.raises(LateAnswer):
        queue.answer("q3", approved=True, approver="alex", note="just in time?",
                     valid_for_ms=60_000, tenant="acme")
    thread.join(5)
    assert not got[0].approved
    assert got[0].timed_out
    row = queue.get("q3", None)
    assert row is not None
    assert row.status == "timed_out"
