"""Revocation lists (seed 000 §3.6 RevocationWatcher): revoke a call id or a grant fingerprint."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from policy_engine.errors import PolicyEngineError
from policy_engine.model import Grant
from policy_engine.orchestration.store_errors import store_error

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_REMEMBERED = 10_000
"""Revoked keys one list holds in memory; a longer list is looked up per call."""


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
        self._known: tuple[int, frozenset[str] | None] | None = None  # (data_version, keys)
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

    def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work`` on the connection; call with the lock held."""
        db = self._db()
        try:
            return work(db)
        except sqlite3.Error as exc:
            # reconnect next time: a replaced or repaired file is picked up
            self._conn = None
            self._known = None
            db.close()
            raise store_error("revocation list", self.path, exc) from exc

    def revoke(self, key: str, *, now_ms: int | None = None) -> None:
        """:raises PolicyEngineError: ``PROVIDER.UNAVAILABLE`` when the list cannot be written."""
        if not key:
            raise ValueError("revocation key must not be empty")
        at = now_ms if now_ms is not None else int(time.time() * 1000)
        with self._lock:
            # this connection's own write: PRAGMA data_version reports only other connections'
            self._known = None
            self._run(lambda db: db.execute(
                "INSERT OR IGNORE INTO revocations (key, revoked_at_ms) VALUES (?, ?)",
                (key, at)))

    def is_revoked(self, grant: Grant) -> bool:
        """:raises PolicyEngineError: ``PROVIDER.UNAVAILABLE`` when the list cannot be read:
        the caller must deny (an unreadable list never means "not revoked").

        Answered from memory while the list is unchanged (issue 27, as tokens are): a list of
        at most ``MAX_REMEMBERED`` keys is read whole and kept with the database's
        ``PRAGMA data_version``, which changes with every commit by any other connection, in
        any process; one statement per call instead of a lookup, and exact. A longer list is
        looked up per call.
        """
        keys = revocation_keys(grant)
        with self._lock:
            known = self._run(self._remembered)
            if known is not None:
                return any(k in known for k in keys)
            marks = ",".join("?" * len(keys))
            return bool(self._run(lambda db: db.execute(
                f"SELECT 1 FROM revocations WHERE key IN ({marks}) LIMIT 1", keys).fetchall()))

    def _remembered(self, db: sqlite3.Connection) -> frozenset[str] | None:
        """Every revoked key, read again when the database changed; ``None`` for a list too
        long to hold."""
        version = int(db.execute("PRAGMA data_version").fetchone()[0])
        if self._known is not None and self._known[0] == version:
            return self._known[1]
        # INVARIANT: the version is read before the rows: a commit between the two is in the
        # rows and changes the version again, so it is read once more, never missed
        rows = db.execute("SELECT key FROM revocations LIMIT ?",
                          (MAX_REMEMBERED + 1,)).fetchall()
        keys = frozenset(str(r[0]) for r in rows) if len(rows) <= MAX_REMEMBERED else None
        self._known = (version, keys)
        return keys

    def close(self) -> None:
        with self._lock:
            self._known = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None
