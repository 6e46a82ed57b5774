"""SQLite evidence sink (``sqlite``): begin/end records plus the seed 002 §6 exec-record table."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy_engine.config import EngineConfig
from policy_engine.evidence import EvidenceSink
from policy_engine.evidence.chain import (
    chained,
    checkpoint,
    line_hash,
    link_of,
    next_link,
    signing_options,
)
from policy_engine.hookspecs import hookimpl
from policy_engine.model import EvidenceBegin, EvidenceEnd, SideEffect
from policy_engine.orchestration.store_errors import cause_of

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS evidence_records (
  seq         INTEGER PRIMARY KEY AUTOINCREMENT,
  envelope_id TEXT NOT NULL,
  type        TEXT NOT NULL CHECK (type IN ('begin', 'end')),
  record      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_records_envelope ON evidence_records (envelope_id);
CREATE TABLE IF NOT EXISTS evidence_checkpoints (
  id     INTEGER PRIMARY KEY AUTOINCREMENT,
  record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sandbox_execs (
  exec_id          TEXT PRIMARY KEY,
  project_id       TEXT,
  task_id          TEXT,
  conversation_id  TEXT,
  skill_id         TEXT,
  image            TEXT,
  cmd              TEXT,
  args             TEXT,
  cwd              TEXT,
  env_keys         TEXT,
  policy_snapshot  TEXT,
  status           TEXT NOT NULL,
  exit_code        INTEGER,
  error_reason     TEXT,
  started_at       INTEGER,
  ended_at         INTEGER,
  duration_ms      REAL,
  artifacts_path   TEXT,
  stdout_truncated INTEGER,
  stderr_truncated INTEGER
);
"""


def _process_meta(ev: EvidenceEnd) -> dict[str, Any]:
    """Merge the process side-effect summaries (request summary + executor's own) of one call."""
    meta: dict[str, Any] = {}
    for rec in ev.side_effects:
        if rec.kind == SideEffect.PROCESS:
            meta.update(rec.meta)
    return meta


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back if SQLite has not already (it does itself on a full disk or I/O error); a
    failing rollback must not hide the error that caused it.
    """
    if db.in_transaction:
        with suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def _commit(db: sqlite3.Connection) -> None:
    """COMMIT; when it fails (disk full) the transaction is rolled back so the next record can
    begin its own instead of failing forever with "transaction within a transaction".
    """
    try:
        db.execute("COMMIT")
    except sqlite3.Error:
        _rollback(db)
        raise


class SqliteSink:
    """Evidence in SQLite (WAL mode so readers never block the writer).

    Column mapping for ``sandbox_execs`` (seed 002 §6): exec_id = envelope_id, project_id =
    tenant, task_id = call_id, conversation_id = subject_id, skill_id = tool_name, image =
    sandbox backend, cmd/args/cwd/env_keys from the process summary (``args`` is the JSON list
    of per-argument summaries — template literal or size + keyed digest, never an argument
    value; env keys, never values),
    policy_snapshot = profile hash + policy version hash, error_reason = error code.
    """

    name = "sqlite"

    def __init__(self, path: Path, *, signing_key: Ed25519PrivateKey | None = None,
                 checkpoint_every: int = 1000) -> None:
        self.path = path
        self._key = signing_key
        self._every = max(1, checkpoint_every)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        except (sqlite3.Error, OSError) as exc:
            raise OSError(f"cannot open evidence database `{path}`: "
                          f"{cause_of(exc, path)}") from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            conn.close()
            raise OSError(f"cannot open evidence database `{path}`: "
                          f"{cause_of(exc, path)}") from exc
        self._conn = conn

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"evidence database `{self.path}` is closed")
        return self._conn

    def begin(self, ev: EvidenceBegin) -> None:
        with self._lock, self._named_errors():
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                self._insert(db, ev.envelope_id, "begin", ev.model_dump_json())
                db.execute(
                    "INSERT OR REPLACE INTO sandbox_execs (exec_id, project_id, task_id, "
                    "conversation_id, skill_id, policy_snapshot, status, started_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
                    (ev.envelope_id, ev.tenant, ev.call_id, ev.subject_id, ev.tool_name,
                     json.dumps({"profile_hash": ev.profile_hash,
                                 "policy_version_hash": ev.policy_version_hash,
                                 "capability": ev.capability}),
                     ev.produced_at_ms))
            except BaseException:
                _rollback(db)
                raise
            _commit(db)

    def end(self, ev: EvidenceEnd) -> None:
        meta = _process_meta(ev)
        exit_code = meta.get("exit_code")
        with self._lock, self._named_errors():
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                self._insert(db, ev.envelope_id, "end", ev.model_dump_json())
                # INSERT OR IGNORE first: an end whose begin went to another sink's spool still
                # gets its row; the UPDATE then fills the end-side columns either way
                db.execute("INSERT OR IGNORE INTO sandbox_execs (exec_id, status) VALUES (?, ?)",
                           (ev.envelope_id, ev.status))
                db.execute(
                    "UPDATE sandbox_execs SET image = ?, cmd = ?, args = ?, cwd = ?, "
                    "env_keys = ?, status = ?, exit_code = ?, error_reason = ?, ended_at = ?, "
                    "duration_ms = ?, artifacts_path = ?, stdout_truncated = ?, "
                    "stderr_truncated = ? WHERE exec_id = ?",
                    (ev.sandbox_backend, meta.get("cmd"),
                     json.dumps(meta["args"]) if "args" in meta else None, meta.get("cwd"),
                     json.dumps(meta["env_keys"]) if "env_keys" in meta else None,
                     ev.status, int(exit_code) if isinstance(exit_code, int) else None,
                     ev.error_code, ev.finished_at_ms, ev.sandbox_latency_ms,
                     meta.get("artifacts_path"),
                     int(bool(meta.get("stdout_truncated", False))),
                     int(bool(meta.get("stderr_truncated", False))), ev.envelope_id))
            except BaseException:
                _rollback(db)
                raise
            _commit(db)

    def _insert(self, db: sqlite3.Connection, envelope_id: str, kind: str, record: str) -> None:
        """Insert ``record`` chained to the last stored one (policy_engine/evidence/chain.py)
        and sign a checkpoint when one is due. Runs inside the caller's ``BEGIN IMMEDIATE``:
        SQLite's write lock keeps another process from inserting between read and insert.
        """
        row = db.execute("SELECT record FROM evidence_records ORDER BY seq DESC LIMIT 1"
                         ).fetchone()
        seq, prev = next_link(row[0].encode() if row else None)
        text = chained(record.encode(), seq, prev)
        db.execute("INSERT INTO evidence_records (envelope_id, type, record) VALUES (?, ?, ?)",
                   (envelope_id, kind, text.decode()))
        if self._key is not None and seq % self._every == self._every - 1:
            self._checkpoint(db, seq, line_hash(text))

    def _checkpoint(self, db: sqlite3.Connection, seq: int, head: str) -> None:
        assert self._key is not None
        db.execute("INSERT INTO evidence_checkpoints (record) VALUES (?)",
                   (checkpoint(self._key, seq, head).decode(),))

    def _close_checkpoint(self, db: sqlite3.Connection) -> None:
        """Sign the last record at close unless a checkpoint covers it already."""
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT record FROM evidence_records ORDER BY seq DESC LIMIT 1"
                             ).fetchone()
            link = link_of(row[0].encode()) if row else None
            if link is not None:
                done = db.execute("SELECT 1 FROM evidence_checkpoints WHERE json_extract("
                                  "record, '$.covers_seq') = ?", (link[0],)).fetchone()
                if not done:
                    self._checkpoint(db, link[0], link[1])
        except BaseException:
            _rollback(db)
            raise
        _commit(db)

    @contextmanager
    def _named_errors(self) -> Iterator[None]:
        """A failing write names the database and the cause (the spool logs it)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise OSError(f"evidence database `{self.path}`: "
                          f"{cause_of(exc, self.path)}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    if self._key is not None:
                        self._close_checkpoint(self._conn)
                except sqlite3.Error as exc:
                    log.error("evidence database `%s`: closing checkpoint not written: %s",
                              self.path, cause_of(exc, self.path))
                finally:
                    self._conn.close()
                    self._conn = None


    def read_records(self) -> Iterator[dict[str, Any]]:
        """The begin/end records in insertion order (the conformance kit reads them back)."""
        with self._lock:
            rows = self._db().execute(
                "SELECT record FROM evidence_records ORDER BY seq").fetchall()
        for (text,) in rows:
            record = json.loads(text)
            if isinstance(record, dict):
                yield record

    def stored_text(self) -> Iterator[str]:
        """Every row of every table as JSON: what the kit greps for planted secrets."""
        with self._lock:
            db = self._db()
            tables = [t for (t,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            rows = [(t, r) for t in tables
                    for r in db.execute(f'SELECT * FROM "{t}"').fetchall()]  # noqa: S608 — names from sqlite_master
        for table, row in rows:
            yield json.dumps({"table": table, "row": list(row)}, default=str)


def _validated_path(config: EngineConfig) -> Path:
    options = config.plugin_options("evidence_sqlite")
    unknown = sorted(set(options) - {"path", "signing_key", "checkpoint_every"})
    if unknown:
        raise ValueError(f"evidence_sqlite: unknown option `{unknown[0]}`")
    return Path(str(options.get("path", config.state_dir / "evidence" / "evidence.sqlite")))


@hookimpl
def policy_engine_evidence_sinks(config: EngineConfig) -> list[EvidenceSink]:
    if not config.wants_sink(SqliteSink.name):
        return []
    path = _validated_path(config)
    key, every = signing_options(config, "evidence_sqlite", path.parent)
    return [SqliteSink(path, signing_key=key, checkpoint_every=every)]
