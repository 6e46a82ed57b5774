"""Revocation lists (seed 000 §3.6 RevocationWatcher): revoke a call id or a grant fingerprint."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

from policy_engine.errors import PolicyEngineError
from policy_engine.model import Grant
from policy_engine.orchestration.store_errors import store_error

log = logging.getLogger(__name__)


def revocation_keys(grant: Grant) -> tuple[str, ...]:
    """The keys under which ``grant`` can be revoked: its call id and, when set, its
    ``decision_key_fingerprint`` (revoking one authorization revokes every call under it).
    """
    keys = [grant.call_id]
    if grant.decision_key_fingerprint:
        keys.append(grant.decision_key_fingerprint)
    return tuple(keys)


@runtime_checkable
class RevocationWatcher(Protocol):
    """Answers "has this grant been revoked?" right before a call runs; raises
    ``PolicyEngineError`` when it cannot tell (the call is then denied with that code).
    """

    def is_revoked(self, grant: Grant) -> bool:
        ...


class MemoryRevocationList:
    """Revocations held in this process only (tests, embedded single-process use)."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def revoke(self, key: str) -> None:
        with self._lock:
            self._keys.add(key)

    def is_revoked(self, grant: Grant) -> bool:
        with self._lock:
            return any(k in self._keys for k in revocation_keys(grant))

    def close(self) -> None:
        """Nothing to release."""


class SqliteRevocationList:
    """Revocations in ``state_dir/revocations.sqlite``: visible to every engine process sharing
    the state directory as soon as ``revoke`` returns (WAL, committed per call).

    A list that cannot be read (corrupted, unreadable, on a broken disk) fails closed:
    construction logs the cause and succeeds, and ``is_revoked`` raises ``PROVIDER.UNAVAILABLE``
    naming the file and the cause, so the call is denied, until the file works again (every
    check retries).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        try:
            with self._lock:
                self._db()
        except PolicyEngineError as exc:
            log.error("%s; every call is denied (%s) until it can be read", exc.reason,
                      exc.code.value)

    def _db(self) -> sqlite3.Connection:
        """The open connection (opened and set up on first use); call with the lock held."""
        if self._conn is not None:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        except (sqlite3.Error, OSError) as exc:
            raise store_error("revocation list", self.path, exc) from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE IF NOT EXISTS revocations "
                         "(key TEXT PRIMARY KEY, revoked_at_ms INTEGER NOT NULL)")
        except sqlite3.Error as exc:
            conn.close()
            raise store_error("revocation list", self.path, exc) from exc
        self._conn = conn
        return conn

    def _execute(self, sql: str, params: tuple[object, ...]) -> list[object]:
        with self._lock:
            db = self._db()
            try:
                return db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                # reconnect next time: a replaced or repaired file is picked up
                self._conn = None
                db.close()
                raise store_error("revocation list", self.path, exc) from exc

    def revoke(self, key: str, *, now_ms: int | None = None) -> None:
        """:raises PolicyEngineError: ``PROVIDER.UNAVAILABLE`` when the list cannot be written."""
        if not key:
            raise ValueError("revocation key must not be empty")
        at = now_ms if now_ms is not None else int(time.time() * 1000)
        self._execute("INSERT OR IGNORE INTO revocations (key, revoked_at_ms) VALUES (?, ?)",
                      (key, at))

    def is_revoked(self, grant: Grant) -> bool:
        """:raises PolicyEngineError: ``PROVIDER.UNAVAILABLE`` when the list cannot be read:
        the caller must deny (an unreadable list never means "not revoked").
        """
        keys = revocation_keys(grant)
        marks = ",".join("?" * len(keys))
        rows = self._execute(f"SELECT 1 FROM revocations WHERE key IN ({marks}) LIMIT 1", keys)
        return bool(rows)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
