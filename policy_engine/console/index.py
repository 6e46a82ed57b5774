"""The console's evidence index: one row per call, read incrementally from the evidence sinks.

The evidence logs are append-only and written for proof, not for queries; the console keeps its
own SQLite index (``console-index.sqlite`` in the state directory) of the fields people filter
on, with one index per filter, so a page of a 1,000,000-call log is a keyset-paginated index
scan (docs/benchmarks.md "Console"). Sources are read from where the last sync stopped — a byte
offset for JSONL, a sequence number for SQLite and PostgreSQL — so a sync costs what was added.
Each row keeps where its records are stored, so a call's page re-reads them and checks their
chain links then (``intact`` / ``tampered`` / ``unchecked``), never trusting the index alone.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from policy_engine.evidence.chain import line_hash

log = logging.getLogger(__name__)
MAX_LINE = 1 << 20
"""A stored record longer than this is not indexed (counted as unreadable)."""
SYNC_BATCH = 2_000
"""Records a page request reads before answering; the console's background sync reads the
rest (a page never waits for a whole large backlog)."""
MAX_LATENCY_ROWS = 500_000
"""Calls the latency percentiles are computed over (the charts ask for one time range)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
  envelope_id TEXT PRIMARY KEY,
  ts          INTEGER NOT NULL,
  tenant      TEXT NOT NULL DEFAULT '',
  subject     TEXT NOT NULL DEFAULT '',
  tool        TEXT NOT NULL DEFAULT '',
  capability  TEXT NOT NULL DEFAULT '',
  kind        TEXT NOT NULL DEFAULT '',
  decision    TEXT NOT NULL DEFAULT 'pending',
  code        TEXT NOT NULL DEFAULT '',
  rule_id     TEXT NOT NULL DEFAULT '',
  backend     TEXT NOT NULL DEFAULT '',
  latency_ms  REAL,
  status      TEXT NOT NULL DEFAULT '',
  consent     TEXT NOT NULL DEFAULT '',
  begin_at    TEXT,
  end_at      TEXT,
  conflict    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS calls_ts ON calls (ts DESC, envelope_id);
CREATE INDEX IF NOT EXISTS calls_tenant ON calls (tenant, ts DESC, envelope_id);
CREATE INDEX IF NOT EXISTS calls_subject ON calls (subject, ts DESC, envelope_id);
CREATE INDEX IF NOT EXISTS calls_tool ON calls (tool, ts DESC, envelope_id);
CREATE INDEX IF NOT EXISTS calls_decision ON calls (decision, ts DESC, envelope_id);
CREATE INDEX IF NOT EXISTS calls_code ON calls (code, ts DESC, envelope_id);
CREATE INDEX IF NOT EXISTS calls_rule ON calls (rule_id, ts DESC, envelope_id);
CREATE INDEX IF NOT EXISTS calls_backend_latency ON calls (backend, latency_ms);
CREATE TABLE IF NOT EXISTS cursors (source TEXT PRIMARY KEY, position INTEGER NOT NULL,
                                    unreadable INTEGER NOT NULL DEFAULT 0,
                                    linked INTEGER NOT NULL DEFAULT 0);
"""
FILTERS = ("tenant", "subject", "tool", "decision", "code", "rule_id")
"""Columns a page filters on by equality (each has its own index)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored record: where it is (``source`` + position) and its raw bytes."""

    source: str
    position: int
    raw: bytes


class Source(Protocol):
    """An evidence log read from a position: ``name`` keys its cursor in the index."""

    name: str

    def read(self, position: int, limit: int) -> tuple[list[Stored], int]: ...

    def at(self, position: int) -> bytes | None: ...

    def after(self, position: int) -> bytes | None: ...


class JsonlSource:
    """A JSONL evidence log; positions are byte offsets of line starts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = f"jsonl:{path}"

    def read(self, position: int, limit: int) -> tuple[list[Stored], int]:
        out: list[Stored] = []
        try:
            fh = self.path.open("rb")
        except OSError:
            return out, position
        with fh:
            fh.seek(position)
            while len(out) < limit:
                line = fh.readline(MAX_LINE + 1)
                if not line.endswith(b"\n"):
                    if len(line) > MAX_LINE:  # a monster line: skip to its end
                        while line and not line.endswith(b"\n"):
                            position += len(line)
                            line = fh.readline(MAX_LINE + 1)
                        position += len(line)
                        out.append(Stored(self.name, -1, b""))
                        continue
                    break  # a torn tail being written: read it at the next sync
                out.append(Stored(self.name, position, line.rstrip(b"\n")))
                position += len(line)
        return out, position

    def at(self, position: int) -> bytes | None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(position)
                line = fh.readline(MAX_LINE + 1)
        except OSError:
            return None
        return line.rstrip(b"\n") if line.endswith(b"\n") else None

    def after(self, position: int) -> bytes | None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(position)
                first = fh.readline(MAX_LINE + 1)
                nxt = fh.readline(MAX_LINE + 1)
        except OSError:
            return None
        return nxt.rstrip(b"\n") if first.endswith(b"\n") and nxt.endswith(b"\n") else None


class SqliteSource:
    """The SQLite sink's ``evidence_records``; positions are its ``seq``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = f"sqlite:{path}"

    def _rows(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        if not self.path.exists():
            return []
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute(sql, args).fetchall()
        except sqlite3.OperationalError:  # no table yet
            return []
        finally:
            db.close()

    def read(self, position: int, limit: int) -> tuple[list[Stored], int]:
        rows = self._rows("SELECT seq, record FROM evidence_records WHERE seq > ? ORDER BY seq "
                          "LIMIT ?", (position, limit))
        out = [Stored(self.name, int(seq), _bytes(rec)) for seq, rec in rows]
        return out, (out[-1].position if out else position)

    def at(self, position: int) -> bytes | None:
        rows = self._rows("SELECT record FROM evidence_records WHERE seq = ?", (position,))
        return _bytes(rows[0][0]) if rows else None

    def after(self, position: int) -> bytes | None:
        rows = self._rows("SELECT record FROM evidence_records WHERE seq > ? ORDER BY seq "
                          "LIMIT 1", (position,))
        return _bytes(rows[0][0]) if rows else None


class PostgresSource:
    """The PostgreSQL sink's ``evidence_records``; positions are its ``id``. Each replica
    chains its own records (``replica``, ``seq``): a record's successor is its replica's next."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.name = "postgres"

    def _rows(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, connect_timeout=5) as conn:
            try:
                return list(conn.execute(sql, args).fetchall())
            except psycopg.errors.UndefinedTable:
                return []

    def read(self, position: int, limit: int) -> tuple[list[Stored], int]:
        rows = self._rows("SELECT id, record FROM evidence_records WHERE id > %s ORDER BY id "
                          "LIMIT %s", (position, limit))
        out = [Stored(self.name, int(i), _bytes(rec)) for i, rec in rows]
        return out, (out[-1].position if out else position)

    def at(self, position: int) -> bytes | None:
        rows = self._rows("SELECT record FROM evidence_records WHERE id = %s", (position,))
        return _bytes(rows[0][0]) if rows else None

    def after(self, position: int) -> bytes | None:
        rows = self._rows("SELECT n.record FROM evidence_records r JOIN evidence_records n ON "
                          "n.replica = r.replica AND n.seq = r.seq + 1 WHERE r.id = %s",
                          (position,))
        return _bytes(rows[0][0]) if rows else None


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return json.dumps(value, separators=(",", ":")).encode()


def _record(raw: bytes) -> dict[str, Any] | None:
    """The record in ``raw``, or ``None`` when it is not a readable JSON object."""
    if not raw or len(raw) > MAX_LINE:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # a line nested thousands deep is unreadable, not a crash
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of calls, newest first, and the cursor of the next page (``None``: last)."""

    rows: list[dict[str, Any]]
    next_cursor: str | None


class EvidenceIndex:
    """The index in ``path`` over ``sources``; thread-safe (one sync at a time)."""

    def __init__(self, path: Path, sources: Sequence[Source]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.sources = {s.name: s for s in sources}
        self._sync_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            db.execute("PRAGMA journal_mode = WAL")
            yield db
        finally:
            db.close()

    # -- ingestion --------------------------------------------------------------------------

    def sync(self, batch: int = SYNC_BATCH, wait_s: float = 2.0) -> int:
        """Index what the sources gained since the last sync (at most ``batch`` records per
        source); returns the number of records read.

        :param wait_s: how long to wait for a sync already running (the background one);
            after that this page shows what is indexed.
        """
        if not self._sync_lock.acquire(timeout=wait_s):
            return 0
        try:
            total = 0
            for source in self.sources.values():
                total += self._sync_one(source, batch)
            return total
        finally:
            self._sync_lock.release()

    def _sync_one(self, source: Source, batch: int) -> int:
        with self._db() as db:
            # the write lock first: another worker's sync then waits and reads the cursor
            # this one leaves, so no record is counted twice
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT position, linked FROM cursors WHERE source = ?",
                                 (source.name,)).fetchone()
                start = int(row[0]) if row else 0
                linked = bool(row[1]) if row else False  # a linked record was read before
                stored, position = source.read(start, batch)
                unreadable = 0
                for item in stored:
                    rec = _record(item.raw)
                    if rec is None or not isinstance(rec.get("envelope_id"), str):
                        unreadable += 1
                        continue
                    _ingest(db, rec, f"{item.source}@{item.position}")
                    if isinstance(rec.get("chain"), dict):
                        linked = True
                    elif linked:  # the chain never loses its links: this record was put there
                        db.execute("UPDATE calls SET conflict = 1 WHERE envelope_id = ?",
                                   (rec["envelope_id"],))
                if position != start:
                    db.execute("INSERT INTO cursors (source, position, unreadable, linked) "
                               "VALUES (?, ?, ?, ?) ON CONFLICT(source) DO UPDATE SET "
                               "position = excluded.position, "
                               "unreadable = unreadable + excluded.unreadable, "
                               "linked = excluded.linked",
                               (source.name, position, unreadable, int(linked)))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return len(stored)

    def start_background(self, interval_s: float = 1.0) -> None:
        """Keep the index current from a daemon thread (large backlogs in big batches)."""
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    while self.sync(batch=50_000, wait_s=0) and not self._stop.is_set():
                        pass
                except Exception:  # a log being rotated or a locked database: try again later
                    log.warning("console index: sync failed", exc_info=True)
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name="console-index", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def unreadable(self) -> int:
        with self._db() as db:
            row = db.execute("SELECT coalesce(sum(unreadable), 0) FROM cursors").fetchone()
        return int(row[0])

    # -- queries ----------------------------------------------------------------------------

    def page(self, filters: dict[str, str], *, since: int | None = None,
             until: int | None = None, cursor: str | None = None, size: int = 50) -> Page:
        """Calls matching every filter (equality), newest first, ``size`` per page."""
        where, args = _where(filters, since, until)
        if cursor:
            ts, _, env = cursor.partition(":")
            where.append("(ts < ? OR (ts = ? AND envelope_id > ?))")
            args += [int(ts), int(ts), env]
        sql = ("SELECT envelope_id, ts, tenant, subject, tool, capability, kind, decision, code, "
               "rule_id, backend, latency_ms, status, consent FROM calls"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY ts DESC, envelope_id LIMIT ?")
        with self._db() as db:
            rows = [dict(r) for r in db.execute(sql, [*args, size + 1]).fetchall()]
        more = len(rows) > size
        rows = rows[:size]
        nxt = f"{rows[-1]['ts']}:{rows[-1]['envelope_id']}" if more and rows else None
        return Page(rows, nxt)

    def call(self, envelope_id: str, tenant: str | None) -> dict[str, Any] | None:
        """One call with its records re-read from the log and their chain checked."""
        with self._db() as db:
            row = db.execute("SELECT * FROM calls WHERE envelope_id = ? AND "
                             "(? IS NULL OR tenant = ?)", (envelope_id, tenant, tenant)).fetchone()
        if row is None:
            return None
        out = dict(row)
        begin, begin_chain = self._reread(out.pop("begin_at"))
        end, end_chain = self._reread(out.pop("end_at"))
        out["begin"], out["end"] = begin, end
        states = [s for s in (begin_chain, end_chain) if s is not None]
        if out.pop("conflict"):  # another record claimed this envelope: one of them was put there
            states.append("tampered")
        out["chain"] = ("tampered" if "tampered" in states
                        else "unchecked" if not states or "unchecked" in states else "intact")
        return out

    def _reread(self, where: str | None) -> tuple[dict[str, Any] | None, str | None]:
        if not where:
            return None, None
        name, _, pos = where.rpartition("@")
        source = self.sources.get(name)
        if source is None:
            return None, "unchecked"
        raw = source.at(int(pos))
        record = _record(raw) if raw is not None else None
        if raw is None or record is None:
            return None, "tampered"  # indexed once, now gone or unreadable
        return record, _chain_state(record, raw, source.after(int(pos)))

    def stats(self, filters: dict[str, str], *, since: int | None = None,
              until: int | None = None, bucket_ms: int = 3_600_000) -> dict[str, Any]:
        """Counts for the charts: calls and refusals per time bucket, refusals by code and by
        rule (top 10), latency percentiles per backend."""
        where, args = _where(filters, since, until)
        cond = " WHERE " + " AND ".join(where) if where else ""
        deny = " AND " if where else " WHERE "
        with self._db() as db:
            series = db.execute(
                f"SELECT (ts / ?) * ? AS b, count(*), sum(decision = 'deny') FROM calls{cond} "
                "GROUP BY b ORDER BY b DESC LIMIT 48", [bucket_ms, bucket_ms, *args]).fetchall()
            by_code = db.execute(
                f"SELECT code, count(*) AS n FROM calls{cond}{deny}decision = 'deny' "
                "GROUP BY code ORDER BY n DESC LIMIT 10", args).fetchall()
            by_rule = db.execute(
                f"SELECT rule_id, count(*) AS n FROM calls{cond}{deny}decision = 'deny' "
                "AND rule_id != '' GROUP BY rule_id ORDER BY n DESC LIMIT 10", args).fetchall()
            latencies: dict[str, list[float]] = {}
            for backend, ms in db.execute(
                    f"SELECT backend, latency_ms FROM calls{cond}{deny}latency_ms IS NOT NULL "
                    "LIMIT ?", [*args, MAX_LATENCY_ROWS]):
                latencies.setdefault(backend, []).append(float(ms))
        latency = []
        for backend in sorted(latencies):
            values = sorted(latencies[backend])
            n = len(values)
            latency.append({"backend": backend or "(none)", "calls": n,
                            **{name: values[min(n - 1, int(q * n))]
                               for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}})
        return {
            "series": [{"at": int(b), "calls": int(c), "refused": int(d or 0)}
                       for b, c, d in reversed(series)],
            "by_code": [{"code": c or "(none)", "calls": int(n)} for c, n in by_code],
            "by_rule": [{"rule": r, "calls": int(n)} for r, n in by_rule],
            "latency": latency,
        }

    def distinct(self, column: str, tenant: str | None, limit: int = 200) -> list[str]:
        """Values of a filter column (for the filter form's suggestions)."""
        if column not in FILTERS:
            raise ValueError(column)
        with self._db() as db:
            rows = db.execute(f"SELECT DISTINCT {column} FROM calls WHERE (? IS NULL OR "
                              f"tenant = ?) AND {column} != '' ORDER BY {column} LIMIT ?",
                              (tenant, tenant, limit)).fetchall()
        return [r[0] for r in rows]


def _where(filters: dict[str, str], since: int | None,
           until: int | None) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    args: list[Any] = []
    for column in FILTERS:
        value = filters.get(column)
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    if since is not None:
        where.append("ts >= ?")
        args.append(since)
    if until is not None:
        where.append("ts < ?")
        args.append(until)
    return where, args


def _chain_state(record: dict[str, Any], raw: bytes, nxt: bytes | None) -> str:
    """``intact`` when the next record links to this one's exact bytes, ``tampered`` when it
    links to other bytes (or a record without a link stands among linked ones), ``unchecked``
    when nothing follows yet or the log was written before chaining."""
    following = _record(nxt) if nxt is not None else None
    chain = following.get("chain") if following else None
    if not isinstance(record.get("chain"), dict):
        # a record of a log written before chaining is followed by the first linked record
        # (seq 0, linking to it) or by another unlinked one; anything else was put there
        if isinstance(chain, dict):
            return ("unchecked" if chain.get("seq") == 0 and chain.get("prev") == line_hash(raw)
                    else "tampered")
        return "unchecked"
    if not isinstance(chain, dict):
        # the tail (only a signed checkpoint covers it: evidence verify), or an unlinked
        # record written after a linked one: the chain never loses its links
        return "tampered" if following is not None else "unchecked"
    return "intact" if chain.get("prev") == line_hash(raw) else "tampered"


def _ingest(db: sqlite3.Connection, rec: dict[str, Any], where: str) -> None:
    env = rec["envelope_id"]
    if rec.get("type") == "begin":
        cap = str(rec.get("capability") or "")
        notes = rec.get("annotations")
        consent = notes.get("consent") if isinstance(notes, dict) else None
        answer = consent.get("answer") if isinstance(consent, dict) else None
        consent_text = ""
        if isinstance(answer, dict):
            consent_text = "approved" if answer.get("approved") else "refused"
        db.execute(
            "INSERT INTO calls (envelope_id, ts, tenant, subject, tool, capability, kind, "
            "consent, begin_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(envelope_id) DO "
            # a second begin for one envelope never replaces the first: the call is flagged
            "UPDATE SET conflict = CASE WHEN calls.begin_at IS NULL THEN calls.conflict ELSE 1 "
            "END, ts = CASE WHEN calls.begin_at IS NULL THEN excluded.ts ELSE calls.ts END, "
            "tenant = CASE WHEN calls.begin_at IS NULL THEN excluded.tenant ELSE calls.tenant "
            "END, subject = CASE WHEN calls.begin_at IS NULL THEN excluded.subject ELSE "
            "calls.subject END, tool = CASE WHEN calls.begin_at IS NULL THEN excluded.tool ELSE "
            "calls.tool END, capability = CASE WHEN calls.begin_at IS NULL THEN "
            "excluded.capability ELSE calls.capability END, kind = CASE WHEN calls.begin_at IS "
            "NULL THEN excluded.kind ELSE calls.kind END, consent = CASE WHEN calls.begin_at IS "
            "NULL THEN excluded.consent ELSE calls.consent END, begin_at = coalesce("
            "calls.begin_at, excluded.begin_at)",
            (env, _int(rec.get("produced_at_ms")), _text(rec.get("tenant")),
             _text(rec.get("subject_id")), _text(rec.get("tool_name")), cap[:500],
             cap.split(":", 1)[0][:40], consent_text, where))
    elif rec.get("type") == "end":
        found = rec.get("rule")
        rule: dict[str, Any] = found if isinstance(found, dict) else {}
        latency = rec.get("sandbox_latency_ms")
        db.execute(
            "INSERT INTO calls (envelope_id, ts, decision, code, rule_id, backend, latency_ms, "
            "status, end_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(envelope_id) DO "
            # a second end never replaces the first either
            "UPDATE SET conflict = CASE WHEN calls.end_at IS NULL THEN calls.conflict ELSE 1 "
            "END, decision = CASE WHEN calls.end_at IS NULL THEN excluded.decision ELSE "
            "calls.decision END, code = CASE WHEN calls.end_at IS NULL THEN excluded.code ELSE "
            "calls.code END, rule_id = CASE WHEN calls.end_at IS NULL THEN excluded.rule_id "
            "ELSE calls.rule_id END, backend = CASE WHEN calls.end_at IS NULL THEN "
            "excluded.backend ELSE calls.backend END, latency_ms = CASE WHEN calls.end_at IS "
            "NULL THEN excluded.latency_ms ELSE calls.latency_ms END, status = CASE WHEN "
            "calls.end_at IS NULL THEN excluded.status ELSE calls.status END, end_at = "
            "coalesce(calls.end_at, excluded.end_at)",
            (env, _int(rec.get("finished_at_ms")),
             _text(rec.get("decision")) or ("deny" if rec.get("status") == "denied" else "allow"),
             _text(rec.get("error_code")), _text(rule.get("id")),
             _text(rec.get("sandbox_backend")),
             float(latency) if isinstance(latency, (int, float)) else None,
             _text(rec.get("status")), where))


def _text(value: Any) -> str:
    return value[:300] if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
