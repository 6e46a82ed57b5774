"""SQLite budget meter (``budget_meter: sqlite``, the default): shared by every process using the
same state directory; counters and concurrency slots in a shared-memory table written behind to
one row per (grant_key, kind) of the database (shared.py).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from plugins.budget_sqlite.leases import SqliteLeases
from plugins.budget_sqlite.shared import SharedMeter
from plugins.budget_sqlite.window import Full, SharedWindows
from policy_engine.budget import BudgetMeter, check_amount, exceeded
from policy_engine.config import EngineConfig
from policy_engine.errors import PolicyEngineError
from policy_engine.hookspecs import hookimpl
from policy_engine.orchestration.store_errors import store_error

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget_usage (
  grant_key TEXT NOT NULL,
  kind      TEXT NOT NULL,
  used      INTEGER NOT NULL,
  PRIMARY KEY (grant_key, kind)
)
"""

# One statement, so one implicit write transaction (autocommit): SQLite takes the write lock when
# the statement starts, so the guard and the add cannot interleave with another writer's. The
# SELECT yields no row when a first charge alone is over the limit; the DO UPDATE's WHERE skips
# the update when the sum would be; either way RETURNING yields nothing and nothing changed.
_CHARGE = """
INSERT INTO budget_usage (grant_key, kind, used)
  SELECT :key, :kind, :amount WHERE :limit IS NULL OR :amount <= :limit
ON CONFLICT (grant_key, kind) DO UPDATE SET used = used + excluded.used
  WHERE :limit IS NULL OR budget_usage.used + excluded.used <= :limit
RETURNING used
"""
_USED = "SELECT used FROM budget_usage WHERE grant_key = ? AND kind = ?"
_BEAT_SCHEMA = "CREATE TABLE IF NOT EXISTS budget_writes (id INTEGER PRIMARY KEY, at_ms INTEGER)"
_BEAT = ("INSERT INTO budget_writes (id, at_ms) VALUES (1, ?) "
         "ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms")
_SET = """
INSERT INTO budget_usage (grant_key, kind, used) VALUES (?, ?, ?)
ON CONFLICT (grant_key, kind) DO UPDATE SET used = excluded.used
"""


class SqliteBudgetMeter:
    """Atomic across threads and processes, one statement per charge.

    The check and the add are one guarded UPSERT (``_CHARGE``) run in autocommit mode: a single
    write statement holds SQLite's write lock from its start to its commit, so the
    read-check-write of one caller cannot interleave with another's, with no ``BEGIN IMMEDIATE``
    / ``COMMIT`` round trips. Each thread keeps its own connection (statements stay prepared in
    its cache; sqlite3 connections are not meant to be shared across threads).

    ``journal_mode=WAL`` lets ``used()`` readers run beside the writer. ``synchronous=NORMAL``
    in WAL mode never corrupts the database and loses nothing if the process crashes; only an
    OS crash or power loss can drop the last few commits. For a budget that means charges made
    just before the machine died may be forgotten, so a grant could re-spend at most those; the
    calls themselves were lost with the machine too. That bounded under-count is the price of not
    fsyncing on every tool call; deployments that cannot accept it can set ``synchronous=FULL``
    on the database.

    A store that cannot be used (unwritable, corrupted, on a full or read-only disk) fails
    closed: construction logs the cause and succeeds, and every charge raises
    ``PROVIDER.UNAVAILABLE`` naming the file and the cause until the store works again (each
    charge retries; nothing is charged or granted in between).

    Charges and concurrency slots go through the shared-memory table of ``shared.py`` (exact
    across processes, written behind to the database at most every 0.2 s): a charge makes no
    write transaction. The database is written once when the meter opens (a store that cannot
    take writes is found then), and whenever a write behind fails, charges are refused as
    above until a write succeeds again; what the table accepted before is written then.
    """

    name = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = path
        self._timeout = busy_timeout_s
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._ready = False  # directory, WAL mode and table are in place
        # bumped on every failure: each thread reconnects at its next use, not only the thread
        # that saw the failure (a connection opened while the file was unwritable stays
        # read-only for its whole life, in whichever thread holds it)
        self._generation = 0
        self._leases: SqliteLeases | None = None  # opened on the first acquire
        # rate windows (WindowCounter): shared memory beside the database, see window.py
        self._windows = SharedWindows(path.with_suffix(".rate"))
        self._windows_failed = False
        self._leases_lock = threading.Lock()
        # counters and slots (shared.py); `_unwritable` is set while the database refuses the
        # writes behind: charges are refused then (fail closed), each retrying the write first
        self._shared = SharedMeter(path.with_suffix(".meter"), self)
        self._unwritable: PolicyEngineError | None = None
        try:
            self._db()
            self._heartbeat()
        except PolicyEngineError as exc:
            self._unwritable = exc
            log.error("%s; calls that charge this budget store are denied (%s) until it works",
                      exc.reason, exc.code.value)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "generation", 0) != self._generation:
            self._drop(conn)
            conn = None
        if conn is None:
            # isolation_level=None: autocommit, each charge is one statement and one transaction
            conn = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None,
                                   check_same_thread=False)
            self._local.conn, self._local.generation = conn, self._generation
            with self._conns_lock:
                self._conns.append(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _db(self) -> sqlite3.Connection:
        """This thread's connection, the store set up on first use."""
        try:
            if not self._ready:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._conn()
            if not self._ready:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(_SCHEMA)
                conn.execute(_BEAT_SCHEMA)
                self._ready = True
            return conn
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: BaseException) -> PolicyEngineError:
        """Drop this thread's connection (the next call reconnects: a replaced or repaired
        file is picked up) and describe the failure.
        """
        self._generation += 1
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            self._drop(conn)
        return store_error("budget store", self.path, exc)

    def _drop(self, conn: sqlite3.Connection) -> None:
        """Close this thread's connection; its next use opens a new one."""
        self._local.conn = None
        with self._conns_lock:
            if conn in self._conns:
                self._conns.remove(conn)
        conn.close()

    def _query(self, sql: str, params: Any) -> list[Any]:
        try:
            # INVARIANT: fetchall steps the statement to its end, so it is reset and its
            # implicit transaction commits here (fetchone would leave it open, holding the lock)
            return self._db().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc

    def check_and_consume(self, grant_key: str, kind: str, amount: int, limit: int | None) -> int:
        check_amount(kind, amount)
        if self._unwritable is not None:
            self._recover()
        try:
            return self._shared.charge(grant_key, kind, amount, limit)
        except OSError as exc:  # the table cannot be mapped: fail closed, naming it
            raise store_error("budget store", self._shared.path, exc) from exc

    def _recover(self) -> None:
        """Write what the table holds and a heartbeat; raises the store error while the
        database still refuses writes."""
        try:
            self._shared.flush()
            self._heartbeat()
        except OSError as exc:
            raise store_error("budget store", self._shared.path, exc) from exc
        self._unwritable = None

    def _heartbeat(self) -> None:
        """One write: a database that cannot take writes is found now, not behind a charge."""
        self.save([])

    # the database under the table (shared.Durable)
    def load(self, key: str, kind: str) -> int:
        row = self._query(_USED, (key, kind))
        return int(row[0][0]) if row else 0

    def save(self, rows: list[tuple[str, str, int]]) -> None:
        try:
            conn = self._db()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(_SET, rows)
                conn.execute(_BEAT, (int(time.time() * 1000),))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._unwritable = self._failed(exc)
            raise self._unwritable from exc
        except PolicyEngineError as exc:
            self._unwritable = exc
            raise

    def charge(self, key: str, kind: str, amount: int, limit: int | None) -> int:
        rows = self._query(_CHARGE, {"key": key, "kind": kind, "amount": amount,
                                     "limit": limit})
        if rows:
            return int(rows[0][0])
        assert limit is not None  # INVARIANT: an unlimited charge always returns its row
        row = self._query(_USED, (key, kind))  # for the message only
        raise exceeded(key, kind, limit, int(row[0][0]) if row else 0, amount)

    def used(self, grant_key: str) -> dict[str, int]:
        rows = self._query("SELECT kind, used FROM budget_usage WHERE grant_key = ?",
                           (grant_key,))
        found = {str(kind): int(used) for kind, used in rows}
        try:
            table = self._shared.used(grant_key)
        except OSError as exc:
            raise store_error("budget store", self._shared.path, exc) from exc
        # the table's count wins (the database's may be behind); a counter loaded and
        # refused at once holds 0 and was never charged
        found.update({k: v for k, v in table.items() if v or k in found})
        return found

    # per-window counts (WindowCounter): the shared-memory table of window.py
    def charge_window(self, key: str, window: int, limit: int) -> int:
        try:
            return self._windows.charge(key, window, limit)
        except Full:  # more tenants than the probed slots hold: one SQLite row, still exact
            return self.check_and_consume(f"{key}/{window}", "calls", 1, limit)
        except OSError as exc:
            # no shared memory here (a file system without shared mappings, a full disk): the
            # SQLite row counts instead, exact as before; said once per process
            if not self._windows_failed:
                self._windows_failed = True
                log.warning("rate counts in `%s` unavailable (%s); counting in `%s`",
                            self._windows.path, exc, self.path)
            return self.check_and_consume(f"{key}/{window}", "calls", 1, limit)

    def window_count(self, key: str, window: int) -> int:
        try:
            counted = self._windows.count(key, window)
        except OSError:
            counted = 0  # nothing could be counted there either
        return counted + self.used(f"{key}/{window}").get("calls", 0)

    # concurrency slots (ConcurrencyMeter): lease rows in the same database, see leases.py
    def _lease_store(self) -> SqliteLeases:
        """The lease table, opened on first use; a store that cannot be used fails closed
        (``PROVIDER.UNAVAILABLE`` naming the file and cause), like a charge."""
        with self._leases_lock:
            if self._leases is None:
                self._db()  # the directory and WAL mode first; raises the store error
                try:
                    self._leases = SqliteLeases(self.path, busy_timeout_s=self._timeout)
                except (sqlite3.Error, OSError) as exc:
                    raise store_error("budget store", self.path, exc) from exc
            return self._leases

    def acquire(self, grant_key: str, limit: int, *, hold_s: float) -> str:
        if self._unwritable is not None:  # refused before the call, as a charge would be
            self._recover()
        try:
            lease = self._shared.acquire(grant_key, limit)
        except OSError as exc:
            raise store_error("budget store", self._shared.path, exc) from exc
        if lease is not None:
            return lease
        try:  # a key too long for the table: its slots are lease rows in the database
            return self._lease_store().acquire(grant_key, limit, hold_s=hold_s)
        except sqlite3.Error as exc:
            # reopen on the next acquire: a connection opened while the file was unwritable
            # would stay read-only after a repair
            with self._leases_lock:
                if self._leases is not None:
                    self._leases.close()
                    self._leases = None
            raise store_error("budget store", self.path, exc) from exc

    def acquire_charging(self, grant_key: str, limit: int, *, hold_s: float, kind: str,
                         amount: int, charge_limit: int | None) -> str:
        """``acquire`` and ``check_and_consume`` in one step of the shared table (its lock
        taken once; issue 27): both or neither."""
        check_amount(kind, amount)
        if self._unwritable is not None:
            self._recover()
        try:
            lease = self._shared.acquire_charging(grant_key, limit, kind, amount, charge_limit)
        except OSError as exc:
            raise store_error("budget store", self._shared.path, exc) from exc
        if lease is not None:
            return lease
        # a key too long for the table: the slot in the database, then the charge (the slot
        # given back when the charge is refused)
        lease = self.acquire(grant_key, limit, hold_s=hold_s)
        try:
            self.check_and_consume(grant_key, kind, amount, charge_limit)
        except BaseException:
            self.release(grant_key, lease)
            raise
        return lease

    def release_charging(self, grant_key: str, lease: str,
                         charges: list[tuple[str, int, int | None]]) -> None:
        """``check_and_consume`` of each charge in order, then ``release``, in one step of the
        shared table; the slot is given back whatever the charges do.

        :raises PolicyEngineError: the first refused charge's refusal (or the store's error),
            once the slot was given back."""
        for kind, amount, _ in charges:
            check_amount(kind, amount)
        try:
            if self._unwritable is not None:
                self._recover()
            done = self._shared.release_charging(grant_key, lease, charges)
        except (OSError, PolicyEngineError) as exc:
            self.release(grant_key, lease)  # logged there when it cannot be given back
            if isinstance(exc, OSError):
                raise store_error("budget store", self._shared.path, exc) from exc
            raise
        if done:
            return
        try:  # a lease row of the database: the charges, then the release, as before
            for kind, amount, limit in charges:
                self.check_and_consume(grant_key, kind, amount, limit)
        finally:
            self.release(grant_key, lease)

    def release(self, grant_key: str, lease: str) -> None:
        try:
            if self._shared.release(grant_key, lease):
                return
        except OSError as exc:  # nothing was released: the holding dies with this process
            log.error("cannot release a concurrency slot in `%s`: %s", self._shared.path, exc)
            return
        if self._leases is None:
            return
        try:
            self._leases.release(grant_key, lease)
        except sqlite3.Error as exc:  # the row expires on its own (hold_s); never fail a call
            log.error("cannot release a concurrency slot in `%s`: %s (it expires by itself)",
                      self.path, exc)

    def close(self) -> None:
        try:
            self._shared.close()  # writes what this process charged
        except (OSError, PolicyEngineError) as exc:
            log.error("budget counters of `%s` stay in `%s` (written by the next process to "
                      "open it): %s", self.path, self._shared.path, exc)
        self._windows.close()
        if self._leases is not None:
            self._leases.close()
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()


def _validated_path(config: EngineConfig) -> Path:
    """Validate the plugin's options before constructing the meter (``path`` only)."""
    options = config.plugin_options("budget_sqlite")
    unknown = sorted(set(options) - {"path"})
    if unknown:
        raise ValueError(f"budget_sqlite: unknown option `{unknown[0]}`")
    return Path(str(options.get("path", config.state_dir / "budget.sqlite")))


@hookimpl
def policy_engine_budget_meter(config: EngineConfig) -> BudgetMeter | None:
    if not config.wants_meter(SqliteBudgetMeter.name):
        return None
    return SqliteBudgetMeter(_validated_path(config))
