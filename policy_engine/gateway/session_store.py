"""The session runtime's sessions and their lifecycle events (SQLite in the state dir)."""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  session_id     TEXT PRIMARY KEY,
  tenant         TEXT NOT NULL,
  subject        TEXT NOT NULL,
  security_mode  TEXT NOT NULL,
  backend        TEXT NOT NULL,
  created_ms     INTEGER NOT NULL,
  expires_ms     INTEGER NOT NULL,
  ended_ms       INTEGER,
  end_reason     TEXT
);
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (tenant, subject);
CREATE TABLE IF NOT EXISTS session_events (
  seq         INTEGER PRIMARY KEY AUTOINCREMENT,
  session_id  TEXT NOT NULL,
  tenant      TEXT NOT NULL,
  at_ms       INTEGER NOT NULL,
  event       TEXT NOT NULL,
  detail      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS session_events_id ON session_events (session_id);
"""
_COLUMNS = ("session_id", "tenant", "subject", "security_mode", "backend", "created_ms",
            "expires_ms", "ended_ms", "end_reason")


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session as stored: who owns it, its sandbox and its lifetime."""

    session_id: str
    tenant: str
    subject: str
    security_mode: str
    backend: str  # the backend every call of the session runs on (fixed at create)
    created_ms: int
    expires_ms: int
    ended_ms: int | None = None
    end_reason: str | None = None  # "deleted" | "expired" | "closed"

    @property
    def live(self) -> bool:
        return self.ended_ms is None

    def to_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "tenant": self.tenant, "subject": self.subject,
                "security_mode": self.security_mode, "backend": self.backend,
                "created_ms": self.created_ms, "expires_ms": self.expires_ms,
                "ended_ms": self.ended_ms, "end_reason": self.end_reason,
                "status": "live" if self.live else "ended"}


class SessionStore:
    """Every read takes the owner (tenant and subject): another owner's session is not found."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600))
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 5000")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def insert_capped(self, info: SessionInfo, cap: int, *, alone_on: str | None = None
                      ) -> str | None:
        """Store ``info`` unless its tenant already has ``cap`` live sessions (``"cap"``) or,
        when ``info.backend`` is ``alone_on``, its owner already has a live session there
        (``"alone"``); one transaction, so two concurrent creates cannot both pass."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (live,) = self._db.execute(
                    "SELECT COUNT(*) FROM sessions WHERE tenant = ? AND ended_ms IS NULL",
                    (info.tenant,)).fetchone()
                (same,) = self._db.execute(
                    "SELECT COUNT(*) FROM sessions WHERE tenant = ? AND subject = ? AND "
                    "backend = ? AND ended_ms IS NULL",
                    (info.tenant, info.subject, alone_on)).fetchone()
                refused = "cap" if live >= cap else (
                    "alone" if same and info.backend == alone_on else None)
                if refused is not None:
                    self._db.execute("ROLLBACK")
                    return refused
                self._db.execute(f"INSERT INTO sessions VALUES ({','.join('?' * 9)})",
                                 tuple(getattr(info, c) for c in _COLUMNS))
                self._db.execute("COMMIT")
                return None
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def live_count(self, now_ms: int) -> int:
        """Sessions not ended and not expired at ``now_ms``, of every tenant (``/metrics``)."""
        with self._lock:
            row = self._db.execute("SELECT count(*) FROM sessions WHERE ended_ms IS NULL AND "
                                   "expires_ms > ?", (now_ms,)).fetchone()
        return int(row[0])

    def get(self, tenant: str, subject: str, session_id: str) -> SessionInfo | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {','.join(_COLUMNS)} FROM sessions "
                "WHERE session_id = ? AND tenant = ? AND subject = ?",
                (session_id, tenant, subject)).fetchone()
        return SessionInfo(*row) if row else None

    def list(self, tenant: str, subject: str, *, live_only: bool = True
             ) -> builtins.list[SessionInfo]:
        where = " AND ended_ms IS NULL" if live_only else ""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {','.join(_COLUMNS)} FROM sessions WHERE tenant = ? AND subject = ?"
                f"{where} ORDER BY created_ms DESC LIMIT 500", (tenant, subject)).fetchall()
        return [SessionInfo(*r) for r in rows]

    def due(self, now_ms: int) -> builtins.list[SessionInfo]:
        """Live sessions whose TTL has passed (the reaper ends them)."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {','.join(_COLUMNS)} FROM sessions "
                "WHERE ended_ms IS NULL AND expires_ms <= ?", (now_ms,)).fetchall()
        return [SessionInfo(*r) for r in rows]

    def extend(self, session_id: str, expires_ms: int) -> None:
        with self._lock:
            self._db.execute("UPDATE sessions SET expires_ms = ? WHERE session_id = ? "
                             "AND ended_ms IS NULL", (expires_ms, session_id))

    def end(self, session_id: str, now_ms: int, reason: str) -> bool:
        """Mark the session ended; ``False`` when it already was (someone else ends it)."""
        with self._lock:
            cur = self._db.execute("UPDATE sessions SET ended_ms = ?, end_reason = ? "
                                   "WHERE session_id = ? AND ended_ms IS NULL",
                                   (now_ms, reason, session_id))
        return cur.rowcount == 1

    def event(self, info: SessionInfo, at_ms: int, event: str, detail: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT INTO session_events (session_id, tenant, at_ms, event, "
                             "detail) VALUES (?, ?, ?, ?, ?)",
                             (info.session_id, info.tenant, at_ms, event,
                              json.dumps(detail, sort_keys=True)))

    def events(self, session_id: str) -> builtins.list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT at_ms, event, detail FROM session_events WHERE "
                                    "session_id = ? ORDER BY seq", (session_id,)).fetchall()
        return [{"at_ms": a, "event": e, "detail": json.loads(d)} for a, e, d in rows]
