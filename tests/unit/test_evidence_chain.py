"""Tamper evidence: real logs are edited, cut, reordered and re-chained; `evidence verify` finds it.

Every log here is written by the real sinks (several processes at once for JSONL) and every
tampering is done on the stored bytes, the way someone with write access to the file would.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from plugins.evidence_jsonl import JsonlSink
from plugins.evidence_sqlite import SqliteSink
from policy_engine.cli.main import cli
from policy_engine.evidence.chain import generate_key, load_signing_key
from policy_engine.model import Digest, EvidenceBegin, EvidenceEnd


def begin(eid: str) -> EvidenceBegin:
    return EvidenceBegin(envelope_id=eid, tenant="acme", subject_id="agent:1", tool_name="t",
                         call_id=f"call-{eid}", profile_hash="p", capability="fs.read:/w/x",
                         inputs_digest=Digest.of(eid.encode()), produced_at_ms=1,
                         policy_version_hash="v1")


def end(eid: str, status: str = "ok") -> EvidenceEnd:
    return EvidenceEnd(envelope_id=eid, status=status,  # type: ignore[arg-type]
                       outputs_digest=Digest.of(b""), finished_at_ms=2)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = tmp_path / "sign.pem", tmp_path / "sign.pub"
    generate_key(private, public)
    return private, public


def write_log(path: Path, calls: int, key: Path | None = None, every: int = 1000) -> None:
    sink = JsonlSink(path, fsync="never",
                     signing_key=load_signing_key(key) if key else None,
                     checkpoint_every=every)
    for i in range(calls):
        sink.begin(begin(f"e{i}"))
        sink.end(end(f"e{i}"))
    sink.close()


def verify(log: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["evidence", "verify", str(log), *extra])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def put(path: Path, rows: list[bytes]) -> None:
    path.write_bytes(b"".join(r + b"\n" for r in rows))


def test_an_untouched_log_verifies(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log = tmp_path / "ev.jsonl"
    write_log(log, 5, keys[0], every=4)
    code, out = verify(log, "--public-key", str(keys[1]), "--require-signature")
    assert code == 0, out
    assert "intact" in out
    rows = [json.loads(r) for r in lines(log)]
    assert [r["chain"]["seq"] for r in rows] == list(range(len(rows)))
    assert rows[-1]["type"] == "checkpoint"  # close() signs what the process leaves behind


def test_an_edited_record_is_named(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    write_log(log, 4)
    rows = lines(log)
    rows[3] = rows[3].replace(b'"status":"ok"', b'"status":"denied"')
    put(log, rows)
    code, out = verify(log)
    assert code == 1
    assert f"{log}:4: edited" in out
    assert "TAMPERED" in out


def test_a_deleted_record_is_named(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    write_log(log, 4)
    rows = lines(log)
    del rows[2]
    put(log, rows)
    code, out = verify(log)
    assert code == 1
    assert f"{log}:3: deleted" in out
    assert "#2..#2 are missing" in out


def test_swapped_records_are_reordered(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    write_log(log, 4)
    rows = lines(log)
    rows[4], rows[5] = rows[5], rows[4]
    put(log, rows)
    code, out = verify(log)
    assert code == 1
    assert f"{log}:5: reordered" in out


def test_a_copied_record_is_inserted(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    write_log(log, 4)
    rows = lines(log)
    rows.insert(5, rows[1])
    put(log, rows)
    code, out = verify(log)
    assert code == 1
    assert f"{log}:6: inserted" in out
    forged = lines(tmp_path / "ev.jsonl")
    forged.insert(2, b'{"type":"end","envelope_id":"e0","status":"ok"}')
    put(log, forged)
    assert f"{log}:3: inserted" in verify(log)[1]


def test_a_rechained_rewrite_fails_the_signed_checkpoint(tmp_path: Path,
                                                          keys: tuple[Path, Path]) -> None:
    """Whoever edits a record and recomputes every later link still cannot forge the
    signature over the rewritten head."""
    log = tmp_path / "ev.jsonl"
    write_log(log, 3, keys[0], every=1000)
    rows = [json.loads(r) for r in lines(log)]
    rows[1]["status"] = "denied"
    prev = "0" * 64
    out = []
    for rec in rows:
        rec["chain"]["prev"] = prev
        raw = json.dumps(rec, separators=(",", ":")).encode()
        prev = hashlib.sha256(raw).hexdigest()
        out.append(raw)
    put(log, out)
    assert verify(log)[0] == 0  # the chain alone is consistent again ...
    code, text = verify(log, "--public-key", str(keys[1]))
    assert code == 1  # ... but the checkpoint signed the original head
    assert "rewritten" in text or "bad-signature" in text
    other_priv, other_pub = tmp_path / "other.pem", tmp_path / "other.pub"
    generate_key(other_priv, other_pub)
    assert "bad-signature" in verify(log, "--public-key", str(other_pub))[1]


def test_unsigned_tail_fails_only_when_a_signature_is_required(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    write_log(log, 2)
    assert verify(log)[0] == 0
    code, out = verify(log, "--require-signature")
    assert code == 1
    assert "protected by the chain only" in out


def _writer(path: str, worker: int, calls: int) -> None:
    sink = JsonlSink(Path(path), fsync="never")
    for i in range(calls):
        sink.begin(begin(f"w{worker}-{i}"))
        sink.end(end(f"w{worker}-{i}"))
    sink.close()


def test_concurrent_processes_keep_one_unforked_chain(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(log), w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = lines(log)
    assert len(rows) == 4 * 60 * 2
    code, out = verify(log)
    assert code == 0, out
    ids = {json.loads(r)["envelope_id"] for r in rows}
    assert len(ids) == 240


def test_sqlite_rows_are_chained_and_an_edited_row_is_named(tmp_path: Path,
                                                            keys: tuple[Path, Path]) -> None:
    db_path = tmp_path / "ev.sqlite"
    sink = SqliteSink(db_path, signing_key=load_signing_key(keys[0]), checkpoint_every=3)
    for i in range(3):
        sink.begin(begin(f"e{i}"))
        sink.end(end(f"e{i}"))
    sink.close()
    code, out = verify(db_path, "--public-key", str(keys[1]), "--require-signature")
    assert code == 0, out
    db = sqlite3.connect(db_path)
    db.execute("UPDATE evidence_records SET record = replace(record, '\"status\":\"ok\"', "
               "'\"status\":\"error\"') WHERE seq = 4")
    db.commit()
    code, out = verify(db_path)
    assert code == 1
    assert f"{db_path}:4: edited" in out
    db.execute("DELETE FROM evidence_records WHERE seq = 2")
    db.commit()
    db.close()
    assert f"{db_path}:3: deleted" in verify(db_path)[1]  # row seq 3 follows the gap


def test_unusable_inputs_exit_2_without_a_traceback(tmp_path: Path) -> None:
    code, out = verify(tmp_path / "missing.jsonl")
    assert code == 2
    assert "cannot read" in out
    log = tmp_path / "ev.jsonl"
    write_log(log, 1)
    (tmp_path / "bad.pem").write_text("not a key")
    code, out = verify(log, "--public-key", str(tmp_path / "bad.pem"))
    assert code == 2
    assert "not a PEM public key" in out


def test_a_log_written_before_chaining_continues_and_its_prefix_is_reported(
        tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    old = [begin("old").model_dump_json().encode(), end("old").model_dump_json().encode()]
    put(log, old)
    write_log(log, 1)
    rows = lines(log)
    assert rows[:2] == old
    assert json.loads(rows[2])["chain"] == {"seq": 0, "prev": hashlib.sha256(old[1]).hexdigest()}
    code, out = verify(log)
    assert code == 1  # indistinguishable from a log whose links were stripped ...
    assert "the first 2 line(s) carry no chain link" in out
    code, out = verify(log, "--allow-unchained-prefix")  # ... unless the operator says so
    assert code == 0, out


def test_stripping_every_link_does_not_pass(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    write_log(log, 2)
    stripped = [json.dumps({k: v for k, v in json.loads(r).items() if k != "chain"}).encode()
                for r in lines(log)]
    put(log, stripped)
    code, out = verify(log)
    assert code == 1
    assert "TAMPERED" in out


def test_a_tail_cut_at_a_checkpoint_is_caught_by_a_head_kept_outside(
        tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """Outsider round 2 F4: cutting a signed log right after an earlier checkpoint leaves a
    valid chain and a valid signature; only a head recorded outside the log shows the cut."""
    log = tmp_path / "ev.jsonl"
    write_log(log, 6, keys[0], every=3)
    code, out = verify(log, "--public-key", str(keys[1]), "--require-signature")
    assert code == 0, out
    head = next(x.split()[1] for x in out.splitlines() if x.startswith("head: "))
    rows = lines(log)
    cut = max(i for i, r in enumerate(rows[:-1]) if json.loads(r)["type"] == "checkpoint")
    put(log, rows[:cut + 1])  # whole later calls dropped, ending on a signed checkpoint
    code, out = verify(log, "--public-key", str(keys[1]), "--require-signature")
    assert code == 0, out  # undetectable from inside the log (documented)
    code, out = verify(log, "--public-key", str(keys[1]), "--head", head)
    assert code == 1, out
    assert "no longer in the log" in out
    assert "TAMPERED" in out
    code, out = verify(log, "--head", "7:nothex")
    assert code == 2, out


_FORGED = {"tenant": "acme", "decision": "allow", "status": "ok", "note": "FORGED"}


@pytest.mark.parametrize("edit", ["fields", "chain-field", "cr", "spaces"])
def test_an_edited_last_checkpoint_line_fails_with_the_key(tmp_path: Path,
                                                           keys: tuple[Path, Path],
                                                           edit: str) -> None:
    """Issue 32 attack L5: the final signed checkpoint has no record after it whose link would
    break, and its signature covers only ``covers_seq``/``head``: fields added to it (or its
    bytes otherwise changed) must still fail, located at that line."""
    log = tmp_path / "ev.jsonl"
    write_log(log, 2, keys[0], every=3)
    rows = lines(log)
    last = json.loads(rows[-1])
    assert last["type"] == "checkpoint"
    if edit == "fields":
        rows[-1] = json.dumps({**last, **_FORGED}).encode()
    elif edit == "chain-field":
        last["chain"]["note"] = "FORGED"
        rows[-1] = json.dumps(last, separators=(",", ":")).encode()
    elif edit == "cr":
        rows[-1] += b"\r"
    else:
        rows[-1] = json.dumps(last).encode()  # same members, other bytes
    put(log, rows)
    code, out = verify(log, "--public-key", str(keys[1]), "--require-signature")
    assert code == 1, out
    assert f"{log}:{len(rows)}: edited: checkpoint at line {len(rows)}" in out
    assert "TAMPERED" in out
    if edit == "fields":
        assert "`decision`, `note`, `status`, `tenant`" in out


def test_an_edited_sqlite_checkpoint_row_fails(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    db_path = tmp_path / "ev.sqlite"
    sink = SqliteSink(db_path, signing_key=load_signing_key(keys[0]), checkpoint_every=3)
    for i in range(3):
        sink.begin(begin(f"e{i}"))
        sink.end(end(f"e{i}"))
    sink.close()
    assert verify(db_path, "--public-key", str(keys[1]), "--require-signature")[0] == 0
    db = sqlite3.connect(db_path)
    (text,) = db.execute("SELECT record FROM evidence_checkpoints ORDER BY id DESC").fetchone()
    forged = json.dumps({**json.loads(text), **_FORGED})
    db.execute("UPDATE evidence_checkpoints SET record = ? WHERE record = ?", (forged, text))
    db.commit()
    db.close()
    code, out = verify(db_path, "--public-key", str(keys[1]), "--require-signature")
    assert code == 1, out
    assert "edited: checkpoint over record #5" in out
    assert "`decision`, `note`, `status`, `tenant`" in out
