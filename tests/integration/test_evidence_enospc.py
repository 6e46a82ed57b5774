"""Evidence on a full disk: a short JSONL write is repaired and no completed record is lost.

The evidence directory is a real 64 KiB tmpfs filled to the last byte mid-run (root needed);
the spool stays on the ordinary disk, so the records the sink refused are replayed once space
is back, each on its own line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from plugins.evidence_jsonl import JsonlSink
from plugins.evidence_jsonl.repair import TornRecord, remove_torn
from policy_engine.evidence.verify import verify_records
from tests.integration.store_fixtures import envelopes, fill, make_fixture, small_tmpfs

pytestmark = pytest.mark.integration


def test_full_evidence_disk_mid_run_leaves_no_torn_line_and_loses_no_record(
        tmp_path: Path) -> None:
    fx = make_fixture(tmp_path / "fx")
    state = tmp_path / "state"
    with small_tmpfs(state / "evidence") as evidence_dir:
        orch = fx.orchestrator(state)
        try:
            ids = [fx.run(orch).envelope_id for _ in range(3)]
            filler = fill(evidence_dir)
            sink = next(s for s in orch.sinks if s.name == "jsonl")
            # the log's own last page may still take a record or two (how many depends on the
            # record sizes): run until one is refused, then every further record hits ENOSPC
            for _ in range(8):
                if sink.pending():
                    break
                ids.append(fx.run(orch).envelope_id)
            before = sink.pending()
            assert before > 0
            full = [fx.run(orch) for _ in range(4)]
            ids += [o.envelope_id for o in full]
            assert all(o.result.ok for o in full)  # a failing sink never blocks a call
            assert sink.pending() == before + 8  # 4 begins + 4 ends wait in the spool
            filler.unlink()
            ids += [fx.run(orch).envelope_id for _ in range(2)]
        finally:
            orch.close()
        raw = (evidence_dir / "evidence.jsonl").read_bytes()
    kinds, bad = envelopes_of(raw, tmp_path)
    assert bad == []  # every line parses: the short write was repaired
    assert raw.endswith(b"\n")
    assert sorted(kinds) == sorted(ids)  # no completed record lost
    assert all(k == ["begin", "end"] for k in kinds.values())
    assert sink.pending() == 0
    # the repaired log, with the spooled records replayed into it, is one unbroken hash chain
    chain = verify_records(raw.split(b"\n")[:-1])
    assert chain.ok, chain.problems
    assert chain.legacy == 0


def test_cli_runs_on_a_full_evidence_disk_repair_the_torn_line(tmp_path: Path) -> None:
    """The reproducer (enospc-torn.sh): separate `policy-engine run` processes, then `stats`."""
    fx = make_fixture(tmp_path / "fx")
    state = tmp_path / "state"
    with small_tmpfs(state / "evidence") as evidence_dir:
        assert fx.cli(state).returncode == 0
        filler = fill(evidence_dir)
        errors = ""
        for _ in range(4):  # the log's last page still takes a record or two, then ENOSPC
            done = fx.cli(state)
            assert done.returncode == 0, done.stderr  # the call ran; its records were spooled
            errors += done.stderr
        assert "Traceback" not in errors
        assert "short write to evidence log" in errors  # the cause, with the path
        assert "removed a torn record" in errors
        filler.unlink()
        last = fx.cli(state)
        assert last.returncode == 0, last.stderr
        log = evidence_dir / "evidence.jsonl"
        kinds, bad = envelopes(log)
        stats = fx.stats(log)
    assert bad == []
    assert len(kinds) == 6
    assert all(k == ["begin", "end"] for k in kinds.values())
    assert "unreadable" not in stats
    assert "begins without end" not in stats
    assert not (state / "spool" / "jsonl.jsonl").read_bytes().strip()


def envelopes_of(raw: bytes, tmp: Path) -> tuple[dict[str, list[str]], list[int]]:
    copy = tmp / "copy.jsonl"
    copy.write_bytes(raw)
    return envelopes(copy)


def test_fixture_records_are_json(tmp_path: Path) -> None:
    """The helper itself: a line that does not parse is reported by number."""
    log = tmp_path / "e.jsonl"
    log.write_bytes(b'{"type":"begin","envelope_id":"a"}\n{"type":"en\n'
                    + json.dumps({"type": "end", "envelope_id": "a"}).encode() + b"\n")
    kinds, bad = envelopes(log)
    assert kinds == {"a": ["begin", "end"]}
    assert bad == [2]


def test_a_record_glued_behind_a_torn_one_is_kept_on_its_own_line(tmp_path: Path) -> None:
    """Another process appended after our short write before we repaired it: only our
    fragment is cut out, the other record stays whole.
    """
    log = tmp_path / "evidence.jsonl"
    whole = b'{"type":"begin","envelope_id":"a"}\n'
    fragment = b'{"type":"end","envelope_id":"a","sta'
    other = b'{"type":"begin","envelope_id":"b"}\n'
    log.write_bytes(whole + fragment + other)
    fd = os.open(log, os.O_RDWR | os.O_APPEND)
    try:
        remove_torn(fd, TornRecord(len(whole), fragment, fragment + b'tus":"ok"}\n'), log)
    finally:
        os.close(fd)
    assert log.read_bytes() == whole + other


def test_opening_a_log_trims_the_unterminated_line_a_crash_left(tmp_path: Path) -> None:
    log = tmp_path / "evidence" / "evidence.jsonl"
    log.parent.mkdir()
    whole = b'{"type":"begin","envelope_id":"a"}\n'
    log.write_bytes(whole + b'{"type":"end","envelope_id":"a","sta')
    sink = JsonlSink(log, fsync="never")
    sink.close()
    assert log.read_bytes() == whole


def test_a_complete_replayed_copy_is_never_taken_for_the_fragment(tmp_path: Path) -> None:
    """The fragment was already trimmed (another process opened the log) and the spooled copy
    replayed at the very same offset: the repair must leave that whole record alone.
    """
    log = tmp_path / "evidence.jsonl"
    whole = b'{"type":"begin","envelope_id":"a"}\n'
    line = json.dumps({"type": "end", "envelope_id": "b" * 32, "status": "ok",
                       "pad": "x" * 100}).encode() + b"\n"
    log.write_bytes(whole + line)
    fd = os.open(log, os.O_RDWR | os.O_APPEND)
    try:
        remove_torn(fd, TornRecord(len(whole), line[:120], line), log)
    finally:
        os.close(fd)
    assert log.read_bytes() == whole + line
