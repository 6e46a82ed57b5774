"""PostgreSQL schema migrations run at start-up: numbered steps per component, applied once.

Several replicas may start at the same moment: a transaction-scoped advisory lock per component
makes one apply the missing steps while the others wait and then find nothing left to do. Only
the shared-state stores use this (``psycopg`` is the optional ``scale`` extra); nothing imports
it unless PostgreSQL is configured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

_LEDGER = """
CREATE TABLE IF NOT EXISTS policy_engine_migrations (
  component  TEXT NOT NULL,
  version    INTEGER NOT NULL,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (component, version)
)
"""


def migrate(conn: Any, component: str, steps: Sequence[str]) -> int:
    """Apply the steps of ``component`` not applied yet (step ``i`` is version ``i + 1``), in
    one transaction; returns the schema version now in force.

    :param conn: an open ``psycopg.Connection``.
    """
    with conn.transaction():
        # hashtext is stable across servers of one major version; the key only has to be the
        # same for every replica of this deployment
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                     ("policy_engine_migrations:" + component,))
        conn.execute(_LEDGER)
        row = conn.execute("SELECT coalesce(max(version), 0) FROM policy_engine_migrations "
                           "WHERE component = %s", (component,)).fetchone()
        current = int(row[0]) if row else 0
        for version, sql in enumerate(steps, 1):
            if version > current:
                conn.execute(sql)
                conn.execute("INSERT INTO policy_engine_migrations (component, version) "
                             "VALUES (%s, %s)", (component, version))
    return len(steps)


def display_dsn(dsn: str) -> str:
    """``postgresql://host:port/dbname`` without user or password: what messages show."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # an unparsable DSN: show nothing of it (it may hold a password)
        return "postgresql://?"
    host = str(parts.get("host") or "localhost")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{quote(host, safe='/.:')}{port}/{parts.get('dbname') or ''}"
