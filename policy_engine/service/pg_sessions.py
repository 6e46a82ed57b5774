"""The session store in PostgreSQL, shared by every replica (``options.service_postgres``):
the same interface and behaviour as gateway/session_store.py's SQLite store."""

from __future__ import annotations

import builtins
import json
from typing import Any

from policy_engine.config import EngineConfig
from policy_engine.gateway.session_store import _COLUMNS, SessionInfo, SessionStore
from policy_engine.pgschema import migrate
from policy_engine.service.pg_stores import PgDatabase, service_dsn

COMPONENT = "service_sessions"  # its own migration ledger: independent of the token tables

MIGRATIONS = [
    """
    CREATE TABLE service_sessions (
      session_id     TEXT PRIMARY KEY,
      tenant         TEXT NOT NULL,
      subject        TEXT NOT NULL,
      security_mode  TEXT NOT NULL,
      backend        TEXT NOT NULL,
      created_ms     BIGINT NOT NULL,
      expires_ms     BIGINT NOT NULL,
      ended_ms       BIGINT,
      end_reason     TEXT
    );
    CREATE INDEX service_sessions_owner ON service_sessions (tenant, subject);
    CREATE INDEX service_sessions_live ON service_sessions (expires_ms) WHERE ended_ms IS NULL;
    CREATE TABLE service_session_events (
      seq         BIGSERIAL PRIMARY KEY,
      session_id  TEXT NOT NULL,
      tenant      TEXT NOT NULL,
      at_ms       BIGINT NOT NULL,
      event       TEXT NOT NULL,
      detail      JSONB NOT NULL
    );
    CREATE INDEX service_session_events_id ON service_session_events (session_id);
    """,
]
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM service_sessions"


class PgSessionStore(SessionStore):
    """``SessionStore`` over ``service_sessions``: a session created through one replica is
    found, extended, used and ended through any other; every read takes the owner."""

    def __init__(self, db: PgDatabase) -> None:  # noqa: D107 — no SQLite file: not super's
        self.db = db
        with db.cursor() as cur:  # connect and migrate now: a bad DSN stops start-up
            migrate(cur.connection, COMPONENT, MIGRATIONS)

    def close(self) -> None:
        self.db.close()

    def insert_capped(self, info: SessionInfo, cap: int, *, alone_on: str | None = None
                      ) -> str | None:
        """As SQLite's: one transaction holding the tenant's advisory lock, so two replicas
        creating at once cannot both pass the cap."""
        with self.db.cursor() as cur, cur.connection.transaction():
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                        ("policy_engine_sessions:" + info.tenant,))
            (live,) = cur.execute("SELECT count(*) FROM service_sessions WHERE tenant = %s "
                                  "AND ended_ms IS NULL", (info.tenant,)).fetchone()
            (same,) = cur.execute(
                "SELECT count(*) FROM service_sessions WHERE tenant = %s AND subject = %s AND "
                "backend = %s AND ended_ms IS NULL",
                (info.tenant, info.subject, alone_on)).fetchone()
            refused = "cap" if live >= cap else (
                "alone" if same and info.backend == alone_on else None)
            if refused is None:
                cur.execute(f"INSERT INTO service_sessions ({', '.join(_COLUMNS)}) VALUES "
                            f"({', '.join('%s' for _ in _COLUMNS)})",
                            tuple(getattr(info, c) for c in _COLUMNS))
        return refused

    def live_count(self, now_ms: int) -> int:
        with self.db.cursor() as cur:
            (count,) = cur.execute("SELECT count(*) FROM service_sessions WHERE ended_ms IS "
                                   "NULL AND expires_ms > %s", (now_ms,)).fetchone()
        return int(count)

    def get(self, tenant: str, subject: str, session_id: str) -> SessionInfo | None:
        with self.db.cursor() as cur:
            row = cur.execute(f"{_SELECT} WHERE session_id = %s AND tenant = %s AND "
                              "subject = %s", (session_id, tenant, subject)).fetchone()
        return SessionInfo(*row) if row else None

    def list(self, tenant: str, subject: str, *, live_only: bool = True
             ) -> builtins.list[SessionInfo]:
        where = " AND ended_ms IS NULL" if live_only else ""
        with self.db.cursor() as cur:
            rows = cur.execute(f"{_SELECT} WHERE tenant = %s AND subject = %s{where} "
                               "ORDER BY created_ms DESC, session_id LIMIT 500",
                               (tenant, subject)).fetchall()
        return [SessionInfo(*r) for r in rows]

    def due(self, now_ms: int) -> builtins.list[SessionInfo]:
        with self.db.cursor() as cur:
            rows = cur.execute(f"{_SELECT} WHERE ended_ms IS NULL AND expires_ms <= %s",
                               (now_ms,)).fetchall()
        return [SessionInfo(*r) for r in rows]

    def extend(self, session_id: str, expires_ms: int) -> None:
        with self.db.cursor() as cur:
            cur.execute("UPDATE service_sessions SET expires_ms = %s WHERE session_id = %s "
                        "AND ended_ms IS NULL", (expires_ms, session_id))

    def end(self, session_id: str, now_ms: int, reason: str) -> bool:
        """``False`` when it already was ended (by this replica or another): one ends it."""
        with self.db.cursor() as cur:
            cur.execute("UPDATE service_sessions SET ended_ms = %s, end_reason = %s "
                        "WHERE session_id = %s AND ended_ms IS NULL",
                        (now_ms, reason, session_id))
            return bool(cur.rowcount == 1)

    def event(self, info: SessionInfo, at_ms: int, event: str, detail: dict[str, Any]) -> None:
        with self.db.cursor() as cur:
            cur.execute("INSERT INTO service_session_events (session_id, tenant, at_ms, event, "
                        "detail) VALUES (%s, %s, %s, %s, %s)",
                        (info.session_id, info.tenant, at_ms, event,
                         json.dumps(detail, sort_keys=True)))

    def events(self, session_id: str) -> builtins.list[dict[str, Any]]:
        with self.db.cursor() as cur:
            rows = cur.execute("SELECT at_ms, event, detail FROM service_session_events "
                               "WHERE session_id = %s ORDER BY seq", (session_id,)).fetchall()
        return [{"at_ms": a, "event": e, "detail": d} for a, e, d in rows]


def open_session_store(engine: EngineConfig) -> SessionStore:
    """The session store ``engine`` configures (PostgreSQL or ``STATE_DIR/sessions.db``).

    :raises StoreUnavailable: ``PROVIDER.UNAVAILABLE`` when the database cannot be used.
    """
    dsn = service_dsn(engine)
    return PgSessionStore(PgDatabase(dsn)) if dsn else SessionStore(
        engine.state_dir / "sessions.db")
