"""SQLite budget meter (``budget_meter: sqlite``, the default): shared by every process using the
same state directory; one row per (grant_key, kind), updated inside ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from policy_engine.budget import BudgetMeter, check_amount, exceeded
from policy_engine.config import EngineConfig
from policy_engine.hookspecs import hookimpl

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget_usage (
  grant_key TEXT NOT NULL,
  kind      TEXT NOT NULL,
  used      INTEGER NOT NULL,
  PRIMARY KEY (grant_key, kind)
)
"""


class SqliteBudgetMeter:
    """Atomic across threads and processes.

    ``BEGIN IMMEDIATE`` takes SQLite's write lock before the read, so the read-check-write of one
    caller cannot interleave with another's (a plain ``BEGIN`` would let two readers both see the
    old value). Each thread gets its own connection because sqlite3 connections are not meant to
    be shared across threads mid-transaction.
    """

    name = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = path
        self._timeout = busy_timeout_s
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._conn()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: we issue BEGIN IMMEDIATE/COMMIT ourselves
            conn = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def check_and_consume(self, grant_key: str, kind: str, amount: int, limit: int | None) -> int:
        check_amount(kind, amount)
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT used FROM budget_usage WHERE grant_key = ? AND kind = ?",
                (grant_key, kind)).fetchone()
            used = int(row[0]) if row else 0
            if limit is not None and used + amount > limit:
                raise exceeded(grant_key, kind, limit, used, amount)
            conn.execute(
                "INSERT INTO budget_usage (grant_key, kind, used) VALUES (?, ?, ?) "
                "ON CONFLICT (grant_key, kind) DO UPDATE SET used = excluded.used",
                (grant_key, kind, used + amount))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return used + amount

    def used(self, grant_key: str) -> dict[str, int]:
        rows = self._conn().execute(
            "SELECT kind, used FROM budget_usage WHERE grant_key = ?", (grant_key,)).fetchall()
        return {str(kind): int(used) for kind, used in rows}

    def close(self) -> None:
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
