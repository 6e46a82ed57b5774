"""The ``sandbox_execs`` records of seed 002 §6, keyed by tenant (SQLite under the state dir)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from policy_engine.service.models import Artifact, ExecRecord
from policy_engine.service.workspace import stored_artifact

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandbox_execs (
  exec_id          TEXT PRIMARY KEY,
  tenant           TEXT NOT NULL,
  subject          TEXT NOT NULL,
  project_id       TEXT NOT NULL,
  task_id          TEXT,
  conversation_id  TEXT,
  skill_id         TEXT,
  cmd              TEXT NOT NULL,
  args             TEXT NOT NULL,
  cwd              TEXT NOT NULL,
  env_keys         TEXT NOT NULL,
  policy_snapshot  TEXT NOT NULL,
  status           TEXT NOT NULL,
  exit_code        INTEGER,
  error_code       TEXT,
  error_reason     TEXT,
  started_at       INTEGER NOT NULL,
  ended_at         INTEGER NOT NULL,
  duration_ms      REAL NOT NULL,
  artifacts_path   TEXT NOT NULL,
  stdout_truncated INTEGER NOT NULL,
  stderr_truncated INTEGER NOT NULL,
  envelope_id      TEXT NOT NULL,
  artifacts        TEXT NOT NULL,
  refusal          TEXT,
  artifacts_truncated INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sandbox_execs_tenant_task ON sandbox_execs (tenant, task_id);
"""
_JSON_COLUMNS = ("args", "env_keys", "policy_snapshot", "refusal")
_BOOL_COLUMNS = ("stdout_truncated", "stderr_truncated", "artifacts_truncated")


class ExecStore:
    """Every query takes the tenant: a record of another tenant is simply not found."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # exec records keep the scripts they ran (`args`): owner-only, as the evidence log
        os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600))
        os.chmod(path, 0o600)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 5000")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(_SCHEMA)
        known = {row[1] for row in self._db.execute("PRAGMA table_info(sandbox_execs)")}
        if "refusal" not in known:  # a store written before refusals were recorded
            self._db.execute("ALTER TABLE sandbox_execs ADD COLUMN refusal TEXT")
        if "artifacts_truncated" not in known:  # a store written before the artifacts cap
            self._db.execute("ALTER TABLE sandbox_execs ADD COLUMN artifacts_truncated "
                             "INTEGER NOT NULL DEFAULT 0")
        self._lock = threading.Lock()
        self._columns = [c for c in ExecRecord.model_fields]

    def close(self) -> None:
        self._db.close()

    def add(self, tenant: str, subject: str, record: ExecRecord,
            artifacts: list[Artifact]) -> None:
        row: dict[str, Any] = record.model_dump()
        for key in _JSON_COLUMNS:
            row[key] = json.dumps(row[key], sort_keys=True)
        for key in _BOOL_COLUMNS:
            row[key] = int(row[key])
        row.update(tenant=tenant, subject=subject,
                   artifacts=json.dumps([a.model_dump() for a in artifacts]))
        names = list(row)
        with self._lock:
            self._db.execute(
                f"INSERT INTO sandbox_execs ({', '.join(names)}) "
                f"VALUES ({', '.join('?' for _ in names)})", [row[n] for n in names])

    def _record(self, row: tuple[Any, ...]) -> ExecRecord:
        data = dict(zip(self._columns, row, strict=True))
        for key in _JSON_COLUMNS:  # NULL: a record written before the column existed
            data[key] = None if data[key] is None else json.loads(data[key])
        for key in _BOOL_COLUMNS:
            data[key] = bool(data[key])
        return ExecRecord.model_validate(data)

    def get(self, tenant: str, exec_id: str) -> ExecRecord | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {', '.join(self._columns)} FROM sandbox_execs "
                "WHERE tenant = ? AND exec_id = ?", (tenant, exec_id)).fetchone()
        return None if row is None else self._record(row)

    def artifacts(self, tenant: str, exec_id: str) -> list[Artifact] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT artifacts FROM sandbox_execs WHERE tenant = ? AND exec_id = ?",
                (tenant, exec_id)).fetchone()
        if row is None:
            return None
        return [stored_artifact(a) for a in json.loads(row[0])]

    def list(self, tenant: str, task_id: str | None, limit: int = 200) -> list[ExecRecord]:
        sql = f"SELECT {', '.join(self._columns)} FROM sandbox_execs WHERE tenant = ?"
        params: list[Any] = [tenant]
        if task_id is not None:
            sql += " AND task_id = ?"
            params.append(task_id)
        sql += " ORDER BY started_at DESC, exec_id LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [self._record(r) for r in rows]
