"""Revocation lists (seed 000 §3.6 RevocationWatcher): revoke a call id or a grant fingerprint."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from policy_engine.errors import PolicyEngineError
from policy_engine.model import Grant
from policy_engine.orchestration.generation import Generation, file_identity
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


# revoked keys kept in memory at most; a longer list is asked on every call, as before
MAX_KEPT_KEYS = 100_000
# the counter's value, the database's (inode, size, mtime, ctime), the WAL's (inode, size, mtime)
_State = tuple[int, tuple[int, int, int, int], tuple[int, ...]]
_SELECT_AFTER = "SELECT rowid, key FROM revocations WHERE rowid > ? ORDER BY rowid LIMIT ?"
# "The rows added since" reads by rowid, which SQLite reuses once the highest row is deleted
# (outsider attack 36: an operator's `DELETE` of a mistaken revocation, then a new one in its
# rowid, was never read). Every delete or update, by any client, moves the epoch, and a
# changed epoch means a full read.
_EPOCH_SCHEMA = """
CREATE TABLE IF NOT EXISTS revocation_epoch (id INTEGER PRIMARY KEY CHECK (id = 1),
                                             epoch INTEGER NOT NULL);
INSERT OR IGNORE INTO revocation_epoch (id, epoch) VALUES (1, 0);
CREATE TRIGGER IF NOT EXISTS revocations_deleted AFTER DELETE ON revocations
BEGIN UPDATE revocation_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS revocations_updated AFTER UPDATE ON revocations
BEGIN UPDATE revocation_epoch SET epoch = epoch + 1 WHERE id = 1; END;
"""


class SqliteRevocationList:
    """Revocations in ``state_dir/revocations.sqlite``: visible to every engine process sharing
    the state directory as soon as ``revoke`` returns (WAL, committed per call).

    A check costs no query while nothing changed: the revoked keys are kept in memory and read
    again (only the rows added since, when the database file itself is the same) when the
    list's generation moved — a counter beside the file (``revocations.sqlite.generation``,
    ``generation.Generation``) that every ``revoke`` bumps after its commit, in any process —
    or when the database or its WAL changed on disk (a row written by another SQLite client).
    Without a usable counter, or past ``MAX_KEPT_KEYS`` keys, every check queries.

    A list that cannot be read (corrupted, unreadable, on a broken disk) fails closed:
    construction logs the cause and succeeds, and ``is_revoked`` raises ``PROVIDER.UNAVAILABLE``
    naming the file and the cause, so the call is denied, until the file works again (every
    check retries).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._wal = path.with_name(path.name + "-wal")
        self._gen_path = path.with_name(path.name + ".generation")
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._conn_file: tuple[int, int] | None = None  # (device, inode) the connection opened
        self._gen: Generation | None = None
        self._gen_error: OSError | None = None
        self._keys: set[str] | None = None  # the revoked keys as of ``_seen``
        self._seen: _State | None = None
        self._last_rowid = 0
        self._epoch: int | None = None  # ``revocation_epoch`` as of the kept keys
        self._incremental = False  # the epoch and its triggers exist
        self._too_many = False
        try:
            with self._lock:
                self._db()
        except PolicyEngineError as exc:
            log.error("%s; every call is denied (%s) until it can be read", exc.reason,
                      exc.code.value)

    def _db(self) -> sqlite3.Connection:
        """The open connection (opened and set up on first use, and again when the file at
        ``path`` is no longer the one it opened); call with the lock held."""
        if self._conn is not None:
            if self._conn_file == file_identity(self.path):
                return self._conn
            # deleted or replaced: a connection to the old inode would read a list nobody
            # writes any more (outsider attack 36: a revocation in the recreated file missed)
            self._drop(self._conn)
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
        try:
            conn.executescript(_EPOCH_SCHEMA)
            self._incremental = True
        except sqlite3.Error as exc:  # e.g. a read-only file: every change is read in full
            log.warning("revocation list `%s`: no deletion counter (%s); every change re-reads "
                        "the whole list", self.path, exc)
            self._incremental = False
        self._conn, self._conn_file = conn, file_identity(self.path)
        return conn

    def _drop(self, db: sqlite3.Connection) -> None:
        """Reconnect next time (a replaced or repaired file is picked up); forget the keys."""
        self._conn, self._keys, self._seen = None, None, None
        db.close()

    def _execute(self, sql: str, params: tuple[object, ...]) -> list[Any]:
        with self._lock:
            db = self._db()
            try:
                return db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                self._drop(db)
                raise store_error("revocation list", self.path, exc) from exc

    def _generation(self) -> Generation | None:
        """The open counter, opened again when its file was replaced; ``None`` when it
        cannot be (the cause in ``_gen_error``). Call with the lock held."""
        if self._gen is not None and not self._gen.replaced():
            return self._gen
        if self._gen is not None:
            self._gen.close()
            self._gen = None
        try:
            self._gen = Generation(self._gen_path)
        except OSError as exc:
            self._gen_error = exc
        return self._gen

    def _state(self) -> _State | None:
        """What the kept keys must have been read under to answer now: the counter, then the
        database's and the WAL's identity, size and times; ``None`` when it cannot be known.
        Call with the lock held."""
        gen = self._generation()
        if gen is None:
            return None
        value = gen.value()  # read first: a change committed after it moves it again
        if value is None:  # a truncated counter: nothing kept can be trusted, ask each time
            return None
        try:
            db = os.stat(self.path)
            try:
                wal = os.stat(self._wal)
                wal_state: tuple[int, ...] = (wal.st_ino, wal.st_size, wal.st_mtime_ns)
            except FileNotFoundError:
                wal_state = ()
        except OSError:
            return None
        return (value, (db.st_ino, db.st_size, db.st_mtime_ns, db.st_ctime_ns), wal_state)

    def _refresh(self, state: _State) -> None:
        """Read the keys for ``state``: the rows added since the last read while the database
        file is the one read before, else all of them. Call with the lock held.

        :raises PolicyEngineError: ``PROVIDER.UNAVAILABLE``, the list cannot be read.
        """
        same_file = self._seen is not None and self._keys is not None and \
            self._seen[1] == state[1]
        self._seen = None
        db = self._db()
        try:
            db.execute("BEGIN")  # the epoch and the rows from one snapshot
            try:
                epoch = (db.execute("SELECT epoch FROM revocation_epoch WHERE id = 1")
                         .fetchone()[0] if self._incremental else None)
                same_file = same_file and epoch is not None and epoch == self._epoch
                after = self._last_rowid if same_file else 0
                rows = db.execute(_SELECT_AFTER, (after, MAX_KEPT_KEYS + 1)).fetchall()
            finally:
                db.execute("COMMIT")
        except (sqlite3.Error, TypeError) as exc:  # TypeError: the epoch row was deleted
            self._drop(db)
            raise store_error("revocation list", self.path,
                              exc if isinstance(exc, sqlite3.Error)
                              else sqlite3.DatabaseError("the epoch row is missing")) from exc
        self._epoch = epoch
        keys = self._keys if same_file and self._keys is not None else set()
        keys.update(key for _, key in rows)
        if len(keys) > MAX_KEPT_KEYS:
            self._keys, self._too_many = None, True
            return
        self._keys, self._seen = keys, state
        self._last_rowid = rows[-1][0] if rows else after

    def revoke(self, key: str, *, now_ms: int | None = None) -> None:
        """:raises PolicyEngineError: ``PROVIDER.UNAVAILABLE`` when the list cannot be written
        (or its generation not moved: the revocation is then committed, but another process
        sees it only once the database file changes)."""
        if not key:
            raise ValueError("revocation key must not be empty")
        at = now_ms if now_ms is not None else int(time.time() * 1000)
        self._execute("INSERT OR IGNORE INTO revocations (key, revoked_at_ms) VALUES (?, ?)",
                      (key, at))
        with self._lock:  # after the commit: whoever reads the new value sees the row
            gen = self._generation()
            if gen is None:
                raise store_error("revocation list", self._gen_path,
                                  self._gen_error or OSError("cannot be opened"))
            try:
                gen.bump()
            except OSError as exc:
                raise store_error("revocation list", self._gen_path, exc) from exc

    def is_revoked(self, grant: Grant) -> bool:
        """:raises PolicyEngineError: ``PROVIDER.UNAVAILABLE`` when the list cannot be read:
        the caller must deny (an unreadable list never means "not revoked").
        """
        keys = revocation_keys(grant)
        with self._lock:
            state = None if self._too_many else self._state()
            if state is not None:
                if state != self._seen:
                    self._refresh(state)
                if self._keys is not None:
                    return not self._keys.isdisjoint(keys)
        marks = ",".join("?" * len(keys))
        rows = self._execute(f"SELECT 1 FROM revocations WHERE key IN ({marks}) LIMIT 1", keys)
        return bool(rows)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._gen is not None:
                self._gen.close()
                self._gen = None
