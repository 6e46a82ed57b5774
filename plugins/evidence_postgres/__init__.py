"""PostgreSQL evidence sink (``postgres``): begin/end records of every replica in one database,
hash-chained per replica (policy_engine/evidence/chain.py), migrated at start-up.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy_engine.config import EngineConfig
from policy_engine.evidence import EvidenceSink
from policy_engine.evidence.chain import chained, checkpoint, line_hash, next_link, signing_options
from policy_engine.hookspecs import hookimpl
from policy_engine.model import EvidenceBegin, EvidenceEnd
from policy_engine.pgschema import display_dsn, migrate

log = logging.getLogger(__name__)

PLUGIN = "evidence_postgres"
_OPTIONS = {"dsn", "replica", "signing_key", "checkpoint_every", "timeout_s"}

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

    Each record is appended in its own transaction that first takes an advisory lock on the
    replica's chain, reads the replica's last record and inserts the next link: two processes
    that share a replica name (several workers on one host) queue on the lock instead of forking
    the chain, and ``UNIQUE (replica, seq)`` refuses a fork should the lock ever be bypassed.
    Replicas never wait for each other.

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
        self._lock_key = "policy_engine_evidence:" + self.replica
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
            conn = psycopg.connect(self._dsn, connect_timeout=self._timeout)
            migrate(conn, "evidence", MIGRATIONS)
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        self._conn = conn
        return conn

    def _failed(self, exc: BaseException) -> OSError:
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
                with db.transaction():
                    db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._lock_key,))
                    row = db.execute("SELECT record FROM evidence_records WHERE replica = %s "
                                     "ORDER BY seq DESC LIMIT 1", (self.replica,)).fetchone()
                    seq, prev = next_link(row[0].encode() if row else None)
                    text = chained(record.encode(), seq, prev)
                    db.execute("INSERT INTO evidence_records (replica, seq, envelope_id, type, "
                               "record) VALUES (%s, %s, %s, %s, %s)",
                               (self.replica, seq, envelope_id, kind, text.decode()))
                    if self._key is not None and seq % self._every == self._every - 1:
                        self._checkpoint(db, seq, line_hash(text))
            except psycopg.Error as exc:
                raise self._failed(exc) from exc

    def _checkpoint(self, db: psycopg.Connection[Any], seq: int, head: str) -> None:
        assert self._key is not None
        db.execute("INSERT INTO evidence_checkpoints (replica, record) VALUES (%s, %s)",
                   (self.replica, checkpoint(self._key, seq, head).decode()))

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

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
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
    key, every = signing_options(config, PLUGIN)
    return PostgresSink(dsn, replica=replica, timeout_s=float(timeout), signing_key=key,
                        checkpoint_every=every)


@hookimpl
def policy_engine_evidence_sinks(config: EngineConfig) -> list[EvidenceSink]:
    if not config.wants_sink(PostgresSink.name) or "*" in config.evidence_sinks and \
            PLUGIN not in config.options:
        return []
    return [sink_from(config)]
