"""PostgreSQL evidence sink (``postgres``): begin/end records of every replica in one database,
hash-chained per replica (policy_engine/evidence/chain.py), migrated at start-up; checkpoints
signed with ``signing_key`` or, by default, the key beside the state's evidence.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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
from policy_engine.lazy import lazy_module
from policy_engine.model import EvidenceBegin, EvidenceEnd
from policy_engine.pgschema import display_dsn, migrate

if TYPE_CHECKING:
    import psycopg
else:  # imported when the sink first connects: a start without PostgreSQL does not pay for it
    psycopg = lazy_module("psycopg", required=True)  # missing: this plugin is "not installed"

log = logging.getLogger(__name__)

PLUGIN = "evidence_postgres"
_OPTIONS = {"dsn", "replica", "signing_key", "checkpoint_every", "timeout_s"}
_RETRIES = 100

# numbered steps: append, never edit a step that has shipped (pgschema.migrate)
MIGRATIONS = [
    """
    CREATE TABLE evidence_records (
      id          BIGSERIAL PRIMARY KEY,
      replica     TEXT NOT NULL,
      seq         BIGINT NOT NULL,
      envelope_id TEXT NOT NULL,
      type        TEXT NOT NULL CHECK (type IN ('begin', 'end')),
      record      TEXT NOT NULL,
      stored_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
      UNIQUE (replica, seq)
    );
    CREATE INDEX evidence_records_envelope ON evidence_records (envelope_id);
    CREATE TABLE evidence_checkpoints (
      id      BIGSERIAL PRIMARY KEY,
      replica TEXT NOT NULL,
      record  TEXT NOT NULL
    );
    """,
]


class PostgresSink:
    """Evidence in PostgreSQL, one chain per ``replica`` (default: the host name).

    Each record is one INSERT (autocommit) of the next link after the last record this sink
    wrote or read: one round trip. ``UNIQUE (replica, seq)`` is what keeps the chain from
    forking when processes share a replica name (several workers on one host): the one that
    loses the race for a position gets a unique violation, reads the replica's new last record
    and links after it. Records are never updated, so a link computed from a record read once
    stays right. Replicas never wait for each other.

    A database that cannot be reached raises ``OSError`` naming it (without credentials): the
    orchestrator's spool keeps the record and delivers it, in order, once the database answers
    (policy_engine/evidence/spool.py). The schema is migrated at the first successful connect.
    """

    name = "postgres"

    def __init__(self, dsn: str, *, replica: str | None = None, timeout_s: float = 5.0,
                 signing_key: Ed25519PrivateKey | None = None,
                 checkpoint_every: int = 1000) -> None:
        self._dsn = dsn
        self.where = display_dsn(dsn)
        self.replica = replica or socket.gethostname()
        self._timeout = max(1, int(timeout_s))
        self._key = signing_key
        self._every = max(1, checkpoint_every)
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._next: tuple[int, str] | None = None  # (seq, prev) of this replica's next record
        try:
            with self._lock:
                self._db()
        except OSError as exc:  # down at start-up: records spool until it answers
            log.error("%s; evidence is spooled until it answers", exc)

    def _db(self) -> psycopg.Connection[Any]:
        """The open connection, connecting (and migrating) when there is none; lock held."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            # autocommit: a record is one INSERT, one round trip, committed on its own
            conn = psycopg.connect(self._dsn, connect_timeout=self._timeout, autocommit=True)
            migrate(conn, "evidence", MIGRATIONS)
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        self._conn = conn
        return conn

    def _failed(self, exc: BaseException) -> OSError:
        self._next = None  # the last write may or may not have landed: read it back
        if self._conn is not None:
            self._conn.close()
            self._conn = None  # reconnect at the next record
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return OSError(f"evidence database `{self.where}`: {cause}")

    def begin(self, ev: EvidenceBegin) -> None:
        self._append(ev.envelope_id, "begin", ev.model_dump_json())

    def end(self, ev: EvidenceEnd) -> None:
        self._append(ev.envelope_id, "end", ev.model_dump_json())

    def _append(self, envelope_id: str, kind: str, record: str) -> None:
        with self._lock:
            db = self._db()
            try:
                for _ in range(_RETRIES):
                    if self._next is None:  # first record, or another writer got there first
                        row = db.execute("SELECT record FROM evidence_records WHERE "
                                         "replica = %s ORDER BY seq DESC LIMIT 1",
                                         (self.replica,)).fetchone()
                        self._next = next_link(row[0].encode() if row else None)
                    seq, prev = self._next
                    text = chained(record.encode(), seq, prev)
                    try:
                        db.execute("INSERT INTO evidence_records (replica, seq, envelope_id, "
                                   "type, record) VALUES (%s, %s, %s, %s, %s)",
                                   (self.replica, seq, envelope_id, kind, text.decode()))
                    except psycopg.errors.UniqueViolation:
                        self._next = None  # a worker sharing this replica name appended
                        continue
                    self._next = (seq + 1, line_hash(text))
                    if self._key is not None and seq % self._every == self._every - 1:
                        self._checkpoint(db, seq, line_hash(text))
                    return
            except psycopg.Error as exc:
                raise self._failed(exc) from exc
        raise OSError(f"evidence database `{self.where}`: replica `{self.replica}` lost the "
                      f"race for its next chain position {_RETRIES} times in a row")

    def _checkpoint(self, db: psycopg.Connection[Any], seq: int, head: str) -> None:
        assert self._key is not None
        try:
            db.execute("INSERT INTO evidence_checkpoints (replica, record) VALUES (%s, %s)",
                       (self.replica, checkpoint(self._key, seq, head).decode()))
        except psycopg.Error as exc:
            # the record itself is stored: raising would spool and store it a second time;
            # the next checkpoint covers this one's records too
            log.error("evidence database `%s`: checkpoint over record #%d of replica `%s` not "
                      "written: %s", self.where, seq, self.replica, exc)

    def read_records(self) -> Iterator[dict[str, Any]]:
        """This replica's records in chain order (the conformance kit reads them back)."""
        with self._lock:
            try:
                rows = self._db().execute("SELECT record FROM evidence_records WHERE "
                                          "replica = %s ORDER BY seq", (self.replica,)).fetchall()
            except psycopg.Error as exc:
                raise self._failed(exc) from exc
        for (text,) in rows:
            record = json.loads(text)
            if isinstance(record, dict):
                yield record

    def stored_text(self) -> Iterator[str]:
        """Every row of this replica's evidence tables as JSON (what the kit greps)."""
        with self._lock:
            try:
                db = self._db()
                rows = [(t, r) for t in ("evidence_records", "evidence_checkpoints")
                        for r in db.execute(f"SELECT * FROM {t} WHERE replica = %s",  # noqa: S608 — fixed names
                                            (self.replica,)).fetchall()]
            except psycopg.Error as exc:
                raise self._failed(exc) from exc
        for table, row in rows:
            yield json.dumps({"table": table, "row": list(row)}, default=str)

    def _close_checkpoint(self) -> None:
        """Sign this replica's last record at close unless a checkpoint covers it already: a
        cut or edited tail then fails ``evidence verify --public-key`` (as JSONL/SQLite)."""
        if self._key is None or self._conn is None or self._conn.closed:
            return
        try:
            row = self._conn.execute("SELECT record FROM evidence_records WHERE replica = %s "
                                     "ORDER BY seq DESC LIMIT 1", (self.replica,)).fetchone()
            link = link_of(row[0].encode()) if row else None
            if link is None:
                return
            done = self._conn.execute(
                "SELECT 1 FROM evidence_checkpoints WHERE replica = %s AND "
                "(record::jsonb ->> 'covers_seq')::bigint = %s LIMIT 1",
                (self.replica, link[0])).fetchone()
        except psycopg.Error as exc:
            log.error("evidence database `%s`: closing checkpoint of replica `%s` not written: "
                      "%s", self.where, self.replica, exc)
            return
        if not done:
            self._checkpoint(self._conn, link[0], link[1])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._close_checkpoint()
                finally:
                    self._conn.close()
                    self._conn = None


def sink_from(config: EngineConfig) -> PostgresSink:
    """Validate ``options.evidence_postgres`` (``dsn`` required) and build the sink."""
    options = config.plugin_options(PLUGIN)
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ValueError(f"{PLUGIN}: unknown option `{unknown[0]}`")
    dsn = options.get("dsn")
    if not isinstance(dsn, str) or not dsn:
        raise ValueError(f"{PLUGIN}: option `dsn` is required, e.g. "
                         "postgresql://policy@db.internal:5432/policy_engine")
    replica = options.get("replica")
    if replica is not None and (not isinstance(replica, str) or not 0 < len(replica) <= 200):
        raise ValueError(f"{PLUGIN}: `replica` must be a name of 1-200 characters")
    timeout = options.get("timeout_s", 5)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 60:
        raise ValueError(f"{PLUGIN}: `timeout_s` must be a number of seconds in (0, 60]")
    # the default key, as JSONL and SQLite have it: beside the state's evidence, 0600, made at
    # first start (issue 32 item 10). Replicas on other hosts each make their own unless they
    # are given one (docs/operations.md): a checkpoint names its key, so both still verify.
    key, every = signing_options(config, PLUGIN, config.state_dir / "evidence")
    return PostgresSink(dsn, replica=replica, timeout_s=float(timeout), signing_key=key,
                        checkpoint_every=every)


@hookimpl
def policy_engine_evidence_sinks(config: EngineConfig) -> list[EvidenceSink]:
    if not config.wants_sink(PostgresSink.name) or "*" in config.evidence_sinks and \
            PLUGIN not in config.options:
        return []
    return [sink_from(config)]
