"""Concurrency slots in the budget database: one lease row per call in flight, shared by every
process using the same state directory (``ConcurrencyMeter``).

A row names its process (host, pid and the pid's start time, so a reused pid is not mistaken for
the holder) and an expiry. Taking a slot first drops the rows of this host whose process is gone
and every expired row, so a killed engine never leaks a slot: on the same host it is freed at the
next acquire, on another host when its lease expires.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from pathlib import Path

from policy_engine.budget import new_lease, too_many
from policy_engine.pid import current as current_pid

# WITHOUT ROWID, keyed by (grant_key, lease): one B-tree, so taking or giving back a slot
# writes one page, not three (a rowid table, its primary-key index and a grant_key index)
_COLUMNS = """(
  grant_key  TEXT NOT NULL,
  lease      TEXT NOT NULL,
  host       TEXT NOT NULL,
  pid        INTEGER NOT NULL,
  pid_start  TEXT NOT NULL,
  expires_ms INTEGER NOT NULL,
  PRIMARY KEY (grant_key, lease)
) WITHOUT ROWID"""
_SCHEMA = f"CREATE TABLE IF NOT EXISTS budget_leases {_COLUMNS}"
# a database of an earlier version: its rows (leases live processes hold) move to the new table
_MIGRATE = (f"CREATE TABLE budget_leases_v2 {_COLUMNS}",
            "INSERT INTO budget_leases_v2 SELECT grant_key, lease, host, pid, pid_start, "
            "expires_ms FROM budget_leases",
            "DROP TABLE budget_leases",
            "ALTER TABLE budget_leases_v2 RENAME TO budget_leases")
_INSERT_UNDER = """
INSERT INTO budget_leases (grant_key, lease, host, pid, pid_start, expires_ms)
  SELECT ?, ?, ?, ?, ?, ?
  WHERE (SELECT count(*) FROM budget_leases WHERE grant_key = ? AND expires_ms > ?) < ?
"""


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, /proc/PID/stat field 22), or ``None``
    when no such process exists; with the pid it names one process across pid reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


class SqliteLeases:
    """Lease rows in ``path``; one connection per thread, each acquire one write transaction."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = path
        self._timeout = busy_timeout_s
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._host = socket.gethostname()
        self._pid = current_pid()
        self._start = process_start(self._pid) or "?"
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_SCHEMA)
            sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' "
                               "AND name = 'budget_leases'").fetchone()[0]
            if "WITHOUT ROWID" not in sql.upper():
                for statement in _MIGRATE:
                    conn.execute(statement)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._pid != current_pid():
            if self._pid != current_pid():  # forked: this process holds its own leases
                self._pid, self._start = current_pid(), process_start(current_pid()) or "?"
            conn = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None,
                                   check_same_thread=False)
            # as the meter's: a lease lost to an OS crash died with the call anyway
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def acquire(self, grant_key: str, limit: int, *, hold_s: float) -> str:
        conn = self._conn()
        now_ms = int(time.time() * 1000)
        lease = new_lease()
        row = (grant_key, lease, self._host, self._pid, self._start, now_ms + int(hold_s * 1000))
        # Fast path: one guarded INSERT, one write transaction (SQLite holds the write lock for
        # the statement, so the count and the insert cannot interleave with another writer's).
        # It counts every unexpired row, a dead process's too: it can only refuse where the
        # full path below might not, and the full path then runs (issue 27: ≈ 4× cheaper).
        if conn.execute(_INSERT_UNDER, (*row, grant_key, now_ms, limit)).rowcount == 1:
            return lease
        # BEGIN IMMEDIATE: the write lock from the first read, so two processes cannot both
        # count N-1 holders and both insert the Nth
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM budget_leases WHERE grant_key = ? AND expires_ms <= ?",
                         (grant_key, now_ms))
            rows = conn.execute("SELECT lease, pid, pid_start FROM budget_leases "
                                "WHERE grant_key = ? AND host = ?",
                                (grant_key, self._host)).fetchall()
            dead = [(lease_,) for lease_, pid, start in rows if process_start(pid) != start]
            conn.executemany("DELETE FROM budget_leases WHERE lease = ?", dead)
            held = conn.execute("SELECT count(*) FROM budget_leases WHERE grant_key = ?",
                                (grant_key,)).fetchone()[0]
            if held >= limit:
                raise too_many(grant_key, limit, int(held))
            conn.execute("INSERT INTO budget_leases VALUES (?, ?, ?, ?, ?, ?)", row)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return lease

    def release(self, grant_key: str, lease: str) -> None:
        self._conn().execute("DELETE FROM budget_leases WHERE grant_key = ? AND lease = ?",
                             (grant_key, lease))  # one page of the one B-tree

    def held(self, grant_key: str) -> int:
        row = self._conn().execute("SELECT count(*) FROM budget_leases WHERE grant_key = ?",
                                   (grant_key,)).fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()
