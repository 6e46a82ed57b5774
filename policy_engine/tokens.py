"""Bearer tokens: each maps to one tenant, subject and role; only a SHA-256 of the secret is stored.

Roles: ``agent`` (the default: calls the API), and for people using the console ``viewer``
(reads the tenant's evidence), ``approver`` (also answers consent requests) and ``admin``
(every tenant, and policy changes). Every role may call the API as its subject.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS service_tokens (
  token_id    TEXT PRIMARY KEY,
  secret_hash TEXT NOT NULL,
  tenant      TEXT NOT NULL,
  subject     TEXT NOT NULL,
  label       TEXT NOT NULL DEFAULT '',
  created_at  INTEGER NOT NULL,
  revoked_at  INTEGER,
  role        TEXT NOT NULL DEFAULT 'agent'
);
"""
ROLES = ("agent", "viewer", "approver", "admin")
"""Token roles, weakest first; the console admits ``viewer`` and above."""
PREFIX = "pet_"
# tenants name a directory of the workspace: a safe path segment, never `.`/`..`
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# printable: no control characters, and no invisible format characters (bidi overrides and
# isolates, zero-width ones; Unicode Cf) that would show a person another name than the real one
_SUBJECT = re.compile(r"[^\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                      r"\u2060-\u206f\ufeff\ufff9-\ufffb]{1,200}")
_TOKEN = re.compile(r"pet_([0-9a-f]{16})\.([A-Za-z0-9_-]{43})")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: the tenant and subject its token maps to."""

    tenant: str
    subject: str
    token_id: str
    role: str = "agent"


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """One stored token, without its secret (which is never stored)."""

    token_id: str
    tenant: str
    subject: str
    label: str
    created_at: int
    revoked_at: int | None
    role: str = "agent"


def check_tenant(tenant: str) -> str:
    """``tenant`` if it is a safe name (letters, digits, ``_.-``; it names a directory)."""
    if not _TENANT.fullmatch(tenant) or tenant.strip(".") == "":
        raise ValueError(f"tenant `{tenant}` must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}")
    return tenant


def check_role(role: str) -> str:
    """``role`` if it is one of :data:`ROLES`."""
    if role not in ROLES:
        raise ValueError(f"role `{role}` must be one of {', '.join(ROLES)}")
    return role


def _hash(secret: str) -> str:
    # the secret is 256 random bits, so one SHA-256 is enough (no password stretching needed)
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


class TokenStore:
    """The token table in ``<state_dir>/tokens.sqlite``; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 5000")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(service_tokens)")}
        if "role" not in columns:  # a tokens.sqlite from before roles: every token an agent's
            self._db.execute("ALTER TABLE service_tokens ADD COLUMN role TEXT NOT NULL "
                             "DEFAULT 'agent'")
        self._lock = threading.Lock()
        self._seen = _Changes(path, self._db)
        self._known: dict[str, Principal] = {}  # bearer -> principal, valid while unchanged

    def close(self) -> None:
        self._seen.close()
        self._db.close()

    def add(self, tenant: str, subject: str, label: str = "",
            role: str = "agent") -> tuple[str, TokenInfo]:
        """Create a token; returns the bearer value (shown once, never stored) and its record.

        :raises ValueError: the tenant, subject or role is not a valid one.
        """
        check_tenant(tenant)
        check_role(role)
        if not _SUBJECT.fullmatch(subject):
            raise ValueError("subject must be 1-200 printable characters (no control or "
                             "invisible format characters)")
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        info = TokenInfo(token_id, tenant, subject, label, int(time.time() * 1000), None, role)
        with self._lock:
            self._db.execute(
                "INSERT INTO service_tokens (token_id, secret_hash, tenant, subject, label, "
                "created_at, revoked_at, role) VALUES (?, ?, ?, ?, ?, ?, NULL, ?)",
                (token_id, _hash(secret), tenant, subject, label, info.created_at, role))
        return f"{PREFIX}{token_id}.{secret}", info

    def list(self) -> list[TokenInfo]:
        with self._lock:
            rows = self._db.execute(
                "SELECT token_id, tenant, subject, label, created_at, revoked_at, role "
                "FROM service_tokens ORDER BY created_at, token_id").fetchall()
        return [TokenInfo(*row) for row in rows]

    def info(self, token_id: str) -> TokenInfo | None:
        """The stored record of ``token_id`` (live or revoked), or ``None``."""
        with self._lock:
            row = self._db.execute(
                "SELECT token_id, tenant, subject, label, created_at, revoked_at, role "
                "FROM service_tokens WHERE token_id = ?", (token_id,)).fetchone()
        return None if row is None else TokenInfo(*row)

    def revoke(self, token_id: str) -> bool:
        """Revoke ``token_id``; ``False`` when no live token has that id."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE service_tokens SET revoked_at = ? WHERE token_id = ? "
                "AND revoked_at IS NULL", (int(time.time() * 1000), token_id))
            # this connection's own change: PRAGMA data_version reports only other connections'
            self._known.clear()
        return cur.rowcount == 1

    def authenticate(self, bearer: str) -> Principal | None:
        """The principal of a live token, or ``None`` (malformed, unknown, revoked, wrong).

        Answers from memory while the table is unchanged: a token revoked by any process (the
        ``tokens revoke`` command, another worker) changes the database, which empties the
        memory before the next answer (``_Changes``). Only live tokens are remembered, at most
        ``MAX_KNOWN``.
        """
        with self._lock:
            if self._seen.changed():
                self._known.clear()
            known = self._known.get(bearer)
            if known is not None:
                return known
            match = _TOKEN.fullmatch(bearer)
            if match is None:
                return None
            token_id, secret = match.groups()
            row = self._db.execute(
                "SELECT secret_hash, tenant, subject, revoked_at, role FROM service_tokens "
                "WHERE token_id = ?", (token_id,)).fetchone()
            if row is None or row[3] is not None:
                return None
            if not hmac.compare_digest(row[0], _hash(secret)):
                return None
            principal = Principal(tenant=row[1], subject=row[2], token_id=token_id,
                                  role=row[4])
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            self._known[bearer] = principal
            return principal


MAX_KNOWN = 4096
"""Live tokens remembered by one store (cleared whole when full: a cache, not a limit)."""


class _Changes:
    """Whether any connection, in any process, changed the token database since the last look.

    In a rollback-journal database (the default here) SQLite increments the header's file
    change counter (4 bytes at offset 24) on every committed change, so one ``pread`` (≈ 1 µs)
    answers; a database in WAL mode does not update it, so there ``PRAGMA data_version``
    (≈ 5–10 µs, a statement) answers. Either is exact: no change is missed.
    """

    def __init__(self, path: Path, db: sqlite3.Connection) -> None:
        wal = db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        self._db = db
        self._fd = -1 if wal else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._last = self._now()

    def _now(self) -> bytes | int:
        if self._fd >= 0:
            return os.pread(self._fd, 4, 24)
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def changed(self) -> bool:
        now = self._now()
        if now == self._last:
            return False
        self._last = now
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
