"""Verifying a hash-chained evidence log: the first edited, deleted, inserted or moved record."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from policy_engine.evidence.chain import (
    GENESIS,
    checkpoint_form_problem,
    key_id,
    line_hash,
    signature_ok,
)
from policy_engine.evidence.jsonline import load_line
from policy_engine.inputs.inputfile import MAX_EVIDENCE_BYTES, read_bounded, read_limited


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: where (1-based position in the log: line or row) and what."""

    position: int
    kind: str  # edited | deleted | inserted | reordered | unreadable | bad-signature
    message: str


@dataclass(slots=True)
class Report:
    records: int = 0
    legacy: int = 0  # unchained records before the chain starts (written before chaining)
    checkpoints: int = 0
    signed_through: int | None = None  # the last record position a valid signature covers
    problems: list[Problem] = field(default_factory=list)
    unsigned: bool = False  # checkpoints present but no public key to check them against
    hashes: dict[int, str] = field(default_factory=dict)  # seq -> hash of each chained record

    @property
    def head(self) -> str | None:
        """`SEQ:HASH` of the last chained record: kept outside the log, it later shows a cut
        tail (``check_head``), which no chain or checkpoint inside the log can."""
        if not self.hashes:
            return None
        last = max(self.hashes)
        return f"{last}:{self.hashes[last]}"

    def check_head(self, head: str, unit: str) -> None:
        """Add a problem unless the log still holds the record ``head`` (`SEQ:HASH`) names."""
        seq_text, _, digest = head.partition(":")
        seq = int(seq_text)
        found = self.hashes.get(seq)
        if found is None:
            self.problems.append(Problem(self.records, "deleted", f"record #{seq}, the head "
                                         "recorded earlier, is no longer in the log: its tail "
                                         "was cut (or the chain breaks before it)"))
        elif found != digest:
            self.problems.append(Problem(self.records, "edited", f"record #{seq} is not the "
                                         "head recorded earlier: the log was rewritten"))

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "records": self.records, "legacy_unchained": self.legacy,
                "checkpoints": self.checkpoints, "signed_through": self.signed_through,
                "head": self.head,
                "signatures_checked": not self.unsigned,
                "problems": [{"position": p.position, "kind": p.kind, "message": p.message}
                             for p in self.problems]}


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        value = load_line(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _seq(record: dict[str, Any] | None) -> int | None:
    chain = record.get("chain") if record else None
    if isinstance(chain, dict) and isinstance(chain.get("seq"), int):
        return int(chain["seq"])
    return None


def verify_records(raws: list[bytes], public: Ed25519PublicKey | None = None,
                   external_checkpoints: list[dict[str, Any]] | None = None,
                   unit: str = "line", positions: list[int] | None = None) -> Report:
    """Walk the chain; stop at the first break (everything after it is suspect anyway).

    Checkpoints are chain members (JSONL) or ``external_checkpoints`` (SQLite's own table).
    Without ``public`` the signatures are not checked and the report says so. ``positions``
    names each record where it is stored (SQLite's ``seq`` column); default: its line number.
    """
    at_ = positions or list(range(1, len(raws) + 1))
    report = Report(records=len(raws))
    parsed = [_parse(r) for r in raws]
    seqs = [_seq(p) for p in parsed]
    seen = Counter(s for s in seqs if s is not None)
    hashes: dict[int, tuple[int, str]] = {}  # seq -> (position, hash)
    start = 0
    while start < len(raws) and seqs[start] is None and parsed[start] is not None:
        start += 1  # a log written before chaining: its prefix is reported, not protected
    report.legacy = start
    expected_seq = 0
    expected_prev = line_hash(raws[start - 1]) if start else GENESIS
    for i in range(start, len(raws)):
        pos, rec, seq = at_[i], parsed[i], seqs[i]
        where = f"{unit} {pos}"
        if rec is None:
            report.problems.append(Problem(pos, "edited", f"{where} is not a JSON object "
                                           "(edited or damaged)"))
            break
        if seq is None:
            report.problems.append(Problem(pos, "inserted", f"{where} carries no chain link: "
                                           "inserted (or its link was removed)"))
            break
        prev = rec["chain"].get("prev")
        if seq > expected_seq:
            later = expected_seq in seqs[i + 1:]
            kind = "reordered" if later else "deleted"
            what = (f"record #{expected_seq} appears later in the log" if later else
                    f"record(s) #{expected_seq}..#{seq - 1} are missing")
            report.problems.append(Problem(pos, kind, f"{where} is record #{seq} but "
                                           f"#{expected_seq} was expected: {what}"))
            break
        if seq < expected_seq:
            if seen[seq] > 1:
                kind, what = "inserted", f"a second record #{seq}: inserted or duplicated"
            else:
                kind, what = "reordered", "records are out of order"
            report.problems.append(Problem(pos, kind, f"{where} is record #{seq} but "
                                           f"#{expected_seq} was expected: {what}"))
            break
        if prev != expected_prev:
            if i == start:
                msg = (f"{where} (record #{seq}) does not continue from the record before it: "
                       "the log's beginning was removed or edited")
                report.problems.append(Problem(pos, "deleted" if seq else "edited", msg))
            else:
                before = at_[i - 1]
                report.problems.append(Problem(
                    before, "edited", f"{unit} {before} (record #{seq - 1}) was edited: its "
                    f"hash no longer matches the link stored in {where}"))
            break
        expected_seq, expected_prev = seq + 1, line_hash(raws[i])
        hashes[seq] = (pos, expected_prev)
        report.hashes[seq] = expected_prev
    checkpoints: list[tuple[int, dict[str, Any], bytes | None]] = [
        (at_[i], p, raws[i]) for i, p in enumerate(parsed)
        if p is not None and p.get("type") == "checkpoint"]
    checkpoints += [(0, c, None) for c in external_checkpoints or []]
    _check_signatures(report, checkpoints, hashes, public, unit)
    return report


def _check_signatures(report: Report,
                      checkpoints: list[tuple[int, dict[str, Any], bytes | None]],
                      hashes: dict[int, tuple[int, str]], public: Ed25519PublicKey | None,
                      unit: str) -> None:
    report.checkpoints = len(checkpoints)
    if public is None:
        report.unsigned = bool(checkpoints)
        return
    kid = key_id(public)
    for pos, cp, raw in checkpoints:
        covers = cp.get("covers_seq")
        if not isinstance(covers, int) or covers not in hashes:
            continue  # beyond the break (already reported) or a checkpoint of another log
        at, digest = hashes[covers]
        where = f"checkpoint at {unit} {pos}" if pos else f"checkpoint over record #{covers}"
        # a checkpoint's bytes beyond what its signature covers are checked too: the last
        # one has no later link to break (issue 32 attack L5)
        bad_form = checkpoint_form_problem(cp, raw)
        if bad_form is not None:
            report.problems.append(Problem(pos or at, "edited", f"{where} {bad_form}: "
                                           "edited after it was signed"))
            return
        if cp.get("key_id") != kid or not signature_ok(public, cp):
            report.problems.append(Problem(pos or at, "bad-signature", f"{where}: the "
                                           "signature does not verify with this public key "
                                           "(forged checkpoint or another key)"))
            return
        if cp.get("head") != digest:
            report.problems.append(Problem(at, "edited", f"{where} signed a different record "
                                           f"#{covers}: records up to {unit} {at} were "
                                           "rewritten (the chain was recomputed)"))
            return
        report.signed_through = max(report.signed_through or 0, at)


def read_jsonl(path: Path) -> list[bytes]:
    """The stored records of a JSONL log (an unterminated torn tail is not a record)."""
    data = read_bounded(path, MAX_EVIDENCE_BYTES)  # a regular file, read whole: bounded
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def read_sqlite(path: Path) -> tuple[list[bytes], list[dict[str, Any]], list[int]]:
    """Records (in insertion order), checkpoints and each record's row ``seq``, read-only.

    :raises ValueError: not an evidence database.
    """
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT seq, record FROM evidence_records ORDER BY seq").fetchall()
            has_cp = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                                "'evidence_checkpoints'").fetchone()
            cps = db.execute("SELECT record FROM evidence_checkpoints ORDER BY id").fetchall() \
                if has_cp else []
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise ValueError(f"`{path}` is not a readable evidence database: {exc}") from None
    records = [r.encode() if isinstance(r, str) else bytes(r) for (_seq, r) in rows]
    checkpoints = [c for c in (_parse(t.encode()) for (t,) in cps) if c is not None]
    return records, checkpoints, [int(seq) for (seq, _r) in rows]


def is_sqlite(path: Path) -> bool:
    """Whether ``path`` starts like a SQLite database.

    :raises NotRegularFile: a device or pipe (opening a FIFO would block, sqlite3 too).
    """
    return read_limited(path, 15) == b"SQLite format 3\x00"
