"""Revocation lists (seed 000 §3.6 RevocationWatcher): revoke a call id or a grant fingerprint."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

from policy_engine.model import Grant


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
    """Answers "has this grant been revoked?" right before a call runs."""

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
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection = sqlite3.connect(
            path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS revocations "
                           "(key TEXT PRIMARY KEY, revoked_at_ms INTEGER NOT NULL)")

    def revoke(self, key: str, *, now_ms: int | None = None) -> None:
        if not key:
            raise ValueError("revocation key must not be empty")
        at = now_ms if now_ms is not None else int(time.time() * 1000)
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO revocations (key, revoked_at_ms) VALUES (?, ?)", (key, at))

    def is_revoked(self, grant: Grant) -> bool:
        keys = revocation_keys(grant)
        marks = ",".join("?" * len(keys))
        with self._lock:
            row = self._conn.execute(
                f"SELECT 1 FROM revocations WHERE key IN ({marks}) LIMIT 1", keys).fetchone()
        return row is not None

    def close(self) -> None:
        with self._lock:
            self._conn.close()
