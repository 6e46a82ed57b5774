"""Export one replica's chain from PostgreSQL into an evidence SQLite file that
``policy-engine evidence verify`` checks (records in chain order, checkpoints beside them).

Usage: python3 -m plugins.evidence_postgres.export DSN REPLICA OUT.sqlite
(``--list`` instead of REPLICA prints the replicas with their record counts).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import psycopg

from policy_engine.pgschema import display_dsn

_SCHEMA = """
CREATE TABLE evidence_records (
  seq INTEGER PRIMARY KEY, envelope_id TEXT NOT NULL, type TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE evidence_checkpoints (id INTEGER PRIMARY KEY AUTOINCREMENT, record TEXT NOT NULL);
"""


def replicas(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT replica, count(*) FROM evidence_records GROUP BY replica "
                            "ORDER BY replica").fetchall()
    return [(str(r), int(n)) for r, n in rows]


def export(dsn: str, replica: str, out: Path) -> int:
    """Write ``replica``'s records (row ``seq`` = chain seq + 1, so a verify report's row
    numbers are the chain positions counted from 1) to a new SQLite file; returns the count.

    :raises FileExistsError: ``out`` exists (never overwritten).
    """
    if out.exists():
        raise FileExistsError(f"`{out}` exists; export into a new file")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT seq, envelope_id, type, record FROM evidence_records "
                            "WHERE replica = %s ORDER BY seq", (replica,)).fetchall()
        cps = conn.execute("SELECT record FROM evidence_checkpoints WHERE replica = %s "
                           "ORDER BY id", (replica,)).fetchall()
    db = sqlite3.connect(out)
    try:
        db.executescript(_SCHEMA)
        db.executemany("INSERT INTO evidence_records VALUES (?, ?, ?, ?)",
                       [(int(seq) + 1, env, kind, rec) for seq, env, kind, rec in rows])
        db.executemany("INSERT INTO evidence_checkpoints (record) VALUES (?)", cps)
        db.commit()
    finally:
        db.close()
    return len(rows)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] == "--list":
        for name, count in replicas(argv[0]):
            print(f"{name}\t{count}")
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        count = export(argv[0], argv[1], Path(argv[2]))
    except (psycopg.Error, OSError) as exc:
        print(f"error: cannot export from `{display_dsn(argv[0])}`: "
              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}", file=sys.stderr)
        return 2
    print(f"{count} records of replica `{argv[1]}` written to {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
