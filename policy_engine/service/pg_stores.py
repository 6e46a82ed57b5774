"""The service's token and exec-record stores in PostgreSQL, shared by every replica
(``options: {service_postgres: {dsn: ...}}``); SQLite under the state directory otherwise.

Same tables and behaviour as tokens.py / execstore.py, migrated at start-up (pgschema.py). A
database that cannot be used answers ``PROVIDER.UNAVAILABLE`` (503, retryable) naming it without
credentials (``StoreUnavailable``): a request is never authenticated on a guess.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from policy_engine.config import EngineConfig
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.pgschema import display_dsn, migrate
from policy_engine.service.errors import ServiceError
from policy_engine.service.execstore import ExecStore
from policy_engine.service.models import Artifact, ExecRecord
from policy_engine.service.workspace import stored_artifact
from policy_engine.tokens import (
    _SUBJECT,
    _TOKEN,
    PREFIX,
    Principal,
    TokenInfo,
    TokenStore,
    _hash,
    check_role,
    check_tenant,
)

log = logging.getLogger(__name__)

OPTIONS = "service_postgres"

MIGRATIONS = [
    """
    CREATE TABLE service_tokens (
      token_id    TEXT PRIMARY KEY,
      secret_hash TEXT NOT NULL,
      tenant      TEXT NOT NULL,
      subject     TEXT NOT NULL,
      label       TEXT NOT NULL DEFAULT '',
      created_at  BIGINT NOT NULL,
      revoked_at  BIGINT
    );
    CREATE TABLE sandbox_execs (
      exec_id          TEXT PRIMARY KEY,
      tenant           TEXT NOT NULL,
      subject          TEXT NOT NULL,
      project_id       TEXT NOT NULL,
      task_id          TEXT,
      conversation_id  TEXT,
      skill_id         TEXT,
      cmd              TEXT NOT NULL,
      args             JSONB NOT NULL,
      cwd              TEXT NOT NULL,
      env_keys         JSONB NOT NULL,
      policy_snapshot  JSONB NOT NULL,
      status           TEXT NOT NULL,
      exit_code        INTEGER,
      error_code       TEXT,
      error_reason     TEXT,
      started_at       BIGINT NOT NULL,
      ended_at         BIGINT NOT NULL,
      duration_ms      DOUBLE PRECISION NOT NULL,
      artifacts_path   TEXT NOT NULL,
      stdout_truncated BOOLEAN NOT NULL,
      stderr_truncated BOOLEAN NOT NULL,
      envelope_id      TEXT NOT NULL,
      artifacts        JSONB NOT NULL
    );
    CREATE INDEX sandbox_execs_tenant_task ON sandbox_execs (tenant, task_id);
    """,
    # the refusal document of a refused or failed exec (policy_engine/refusal.py)
    "ALTER TABLE sandbox_execs ADD COLUMN refusal JSONB;",
    # token roles (the console's viewer / approver / admin); existing tokens: agent
    "ALTER TABLE service_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'agent';",
    # an exec's artifacts listed up to --max-artifacts: whether more were left unlisted
    "ALTER TABLE sandbox_execs ADD COLUMN artifacts_truncated BOOLEAN NOT NULL DEFAULT FALSE;",
]


class StoreUnavailable(ServiceError):
    """``PROVIDER.UNAVAILABLE`` (503, retryable) as the service answers it; ``reason`` (the
    database and the cause, never the password) goes to the log and the CLI."""

    def __init__(self, err: PolicyEngineError) -> None:
        view = err.public_view()
        super().__init__(view["code"], view["http_status"], view["message"], view["retryable"])
        self.reason = err.reason
        self.error = err


class PgDatabase:
    """One connection (autocommit, serialised by a lock), reopened after a failure."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self.where = display_dsn(dsn)
        self._lock = threading.Lock()
        self._conn: Any = None
        with self.cursor():  # connect and migrate now: a bad DSN stops start-up, named
            pass

    @contextmanager
    def cursor(self) -> Iterator[Any]:
        import psycopg

        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
                    migrate(conn, "service", MIGRATIONS)
                    self._conn = conn
                with self._conn.cursor() as cur:
                    yield cur
            except psycopg.Error as exc:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                cause = str(exc).strip().splitlines()[0] if str(exc).strip() else \
                    type(exc).__name__
                # the caller is told which database, never its error text (it can quote the
                # request's own data back, and the schema); the log and the CLI have the cause
                err = PolicyEngineError(
                    ErrorCode.PROVIDER_UNAVAILABLE,
                    f"service database `{self.where}` cannot be used",
                    audit={"store": "service database", "path": self.where,
                           "exception": type(exc).__name__})
                unavailable = StoreUnavailable(err)
                unavailable.reason = f"{err.reason}: {cause}"
                log.error("%s", unavailable.reason)
                raise unavailable from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class PgTokenStore(TokenStore):
    """``TokenStore`` over ``service_tokens`` in PostgreSQL: a token added or revoked through
    one replica is honoured (or refused) by every other at its next request."""

    def __init__(self, db: PgDatabase) -> None:  # noqa: D107 — no SQLite file: not super's
        self.db = db

    def close(self) -> None:
        self.db.close()

    def add(self, tenant: str, subject: str, label: str = "",
            role: str = "agent") -> tuple[str, TokenInfo]:
        check_tenant(tenant)
        check_role(role)
        if not _SUBJECT.fullmatch(subject):
            raise ValueError("subject must be 1-200 printable characters (no control or "
                             "invisible format characters)")
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        info = TokenInfo(token_id, tenant, subject, label, int(time.time() * 1000), None, role)
        with self.db.cursor() as cur:
            cur.execute("INSERT INTO service_tokens (token_id, secret_hash, tenant, subject, "
                        "label, created_at, revoked_at, role) "
                        "VALUES (%s, %s, %s, %s, %s, %s, NULL, %s)",
                        (token_id, _hash(secret), tenant, subject, label, info.created_at, role))
        return f"{PREFIX}{token_id}.{secret}", info

    def list(self) -> list[TokenInfo]:
        with self.db.cursor() as cur:
            rows = cur.execute("SELECT token_id, tenant, subject, label, created_at, revoked_at, "
                               "role FROM service_tokens ORDER BY created_at, token_id"
                               ).fetchall()
        return [TokenInfo(*row) for row in rows]

    def info(self, token_id: str) -> TokenInfo | None:
        with self.db.cursor() as cur:
            row = cur.execute("SELECT token_id, tenant, subject, label, created_at, revoked_at, "
                              "role FROM service_tokens WHERE token_id = %s",
                              (token_id,)).fetchone()
        return None if row is None else TokenInfo(*row)

    def revoke(self, token_id: str) -> bool:
        with self.db.cursor() as cur:
            cur.execute("UPDATE service_tokens SET revoked_at = %s WHERE token_id = %s "
                        "AND revoked_at IS NULL", (int(time.time() * 1000), token_id))
            return bool(cur.rowcount == 1)

    def authenticate(self, bearer: str) -> Principal | None:
        match = _TOKEN.fullmatch(bearer)
        if match is None:
            return None
        token_id, secret = match.groups()
        with self.db.cursor() as cur:
            row = cur.execute("SELECT secret_hash, tenant, subject, revoked_at, role FROM "
                              "service_tokens WHERE token_id = %s", (token_id,)).fetchone()
        if row is None or row[3] is not None:
            return None
        if not hmac.compare_digest(row[0], _hash(secret)):
            return None
        return Principal(tenant=row[1], subject=row[2], token_id=token_id, role=row[4])


_JSON_COLUMNS = ("args", "env_keys", "policy_snapshot", "refusal")


class PgExecStore(ExecStore):
    """``ExecStore`` over ``sandbox_execs`` in PostgreSQL; every query takes the tenant."""

    def __init__(self, db: PgDatabase) -> None:  # noqa: D107 — no SQLite file: not super's
        self.db = db
        self._columns = list(ExecRecord.model_fields)

    def close(self) -> None:
        self.db.close()

    def add(self, tenant: str, subject: str, record: ExecRecord,
            artifacts: list[Artifact]) -> None:
        row: dict[str, Any] = record.model_dump()
        for key in _JSON_COLUMNS:
            row[key] = json.dumps(row[key], sort_keys=True)
        row.update(tenant=tenant, subject=subject,
                   artifacts=json.dumps([a.model_dump() for a in artifacts]))
        names = list(row)
        with self.db.cursor() as cur:
            cur.execute(f"INSERT INTO sandbox_execs ({', '.join(names)}) "
                        f"VALUES ({', '.join('%s' for _ in names)})", [row[n] for n in names])

    def _record(self, row: tuple[Any, ...]) -> ExecRecord:
        return ExecRecord.model_validate(dict(zip(self._columns, row, strict=True)))

    def get(self, tenant: str, exec_id: str) -> ExecRecord | None:
        with self.db.cursor() as cur:
            row = cur.execute(f"SELECT {', '.join(self._columns)} FROM sandbox_execs "
                              "WHERE tenant = %s AND exec_id = %s", (tenant, exec_id)).fetchone()
        return None if row is None else self._record(row)

    def artifacts(self, tenant: str, exec_id: str) -> list[Artifact] | None:
        with self.db.cursor() as cur:
            row = cur.execute("SELECT artifacts FROM sandbox_execs WHERE tenant = %s AND "
                              "exec_id = %s", (tenant, exec_id)).fetchone()
        return None if row is None else [stored_artifact(a) for a in row[0]]

    def list(self, tenant: str, task_id: str | None, limit: int = 200) -> list[ExecRecord]:
        sql = f"SELECT {', '.join(self._columns)} FROM sandbox_execs WHERE tenant = %s"
        params: list[Any] = [tenant]
        if task_id is not None:
            sql += " AND task_id = %s"
            params.append(task_id)
        sql += " ORDER BY started_at DESC, exec_id LIMIT %s"
        params.append(limit)
        with self.db.cursor() as cur:
            rows = cur.execute(sql, params).fetchall()
        return [self._record(r) for r in rows]


def service_dsn(engine: EngineConfig) -> str | None:
    """``options.service_postgres.dsn``, validated; ``None`` keeps the SQLite stores."""
    options = engine.plugin_options(OPTIONS)
    unknown = sorted(set(options) - {"dsn"})
    if unknown:
        raise ValueError(f"{OPTIONS}: unknown option `{unknown[0]}`")
    dsn = options.get("dsn")
    if dsn is not None and (not isinstance(dsn, str) or not dsn):
        raise ValueError(f"{OPTIONS}: `dsn` must be a PostgreSQL connection string")
    return dsn


def open_token_store(engine: EngineConfig) -> TokenStore:
    """The token store ``engine`` configures (PostgreSQL or ``tokens.sqlite``).

    :raises StoreUnavailable: ``PROVIDER.UNAVAILABLE`` when the database cannot be used.
    """
    dsn = service_dsn(engine)
    return PgTokenStore(PgDatabase(dsn)) if dsn else TokenStore(
        engine.state_dir / "tokens.sqlite")


def open_exec_store(engine: EngineConfig) -> ExecStore:
    dsn = service_dsn(engine)
    return PgExecStore(PgDatabase(dsn)) if dsn else ExecStore(
        engine.state_dir / "service.sqlite")
