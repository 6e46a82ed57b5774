"""Console sign-in: a service token with a person's role becomes a server-side session.

The browser holds only a random session id in an ``HttpOnly``, ``SameSite=Strict`` cookie
(``Secure`` behind TLS); the session row keeps the token id, and every request re-reads the
token, so revoking it ends the session at the next click. Every form carries the session's
CSRF token; the sign-in form, before any session exists, carries one bound to a short-lived
pre-session cookie (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from policy_engine.tokens import ROLES, TokenStore

COOKIE = "pe_console"
PRE_COOKIE = "pe_console_pre"
SESSION_IDLE_MS = 60 * 60 * 1000
SESSION_MAX_MS = 12 * 60 * 60 * 1000
CONSOLE_ROLES = ("viewer", "approver", "admin")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS console_sessions (
  id_hash    TEXT PRIMARY KEY,
  token_id   TEXT NOT NULL,
  csrf       TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  seen_at    INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is signed in: the token's tenant, subject and role, and the session's CSRF token."""

    tenant: str
    subject: str
    role: str
    token_id: str
    csrf: str

    @property
    def scope(self) -> str | None:
        """The tenant whose data this person sees; ``None`` for an admin (every tenant)."""
        return None if self.role == "admin" else self.tenant

    def may(self, role: str) -> bool:
        """Whether this person's role is ``role`` or stronger."""
        return ROLES.index(self.role) >= ROLES.index(role)


class SignInError(Exception):
    """Why a sign-in was refused (shown to the person, never the token)."""


class Sessions:
    """Sessions in ``path`` (shared by every worker of ``serve --workers``)."""

    def __init__(self, path: Path, tokens: TokenStore) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.tokens = tokens
        with self._db() as db:
            db.executescript(_SCHEMA)
        self._secret = _secret(path.with_name("console-secret.key"))

    def pre_token(self) -> str:
        """A sign-in form's CSRF token: random, and signed by this console, so a value planted
        in the pre-session cookie by another site (cookies ignore ports) is refused."""
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def pre_ok(self, value: str | None) -> bool:
        """Whether ``value`` is a sign-in token this console made."""
        if not value or len(value) > 200 or "." not in value:
            return False
        nonce, _, mac = value.rpartition(".")
        return hmac.compare_digest(mac.encode(), self._sign(nonce).encode())

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()[:43]

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def sign_in(self, bearer: str) -> tuple[str, Viewer]:
        """A new session for the token ``bearer``; returns the cookie value and the viewer."""
        principal = self.tokens.authenticate(bearer.strip())
        if principal is None:
            raise SignInError("that token is not a live token of this service")
        if principal.role not in CONSOLE_ROLES:
            raise SignInError(f"a token with role `{principal.role}` cannot use the console; "
                              "create one with `policy-engine tokens add --role viewer` (or "
                              "approver, admin)")
        sid, csrf, now = secrets.token_urlsafe(32), secrets.token_urlsafe(32), _now()
        with self._db() as db:
            db.execute("DELETE FROM console_sessions WHERE seen_at < ? OR created_at < ?",
                       (now - SESSION_IDLE_MS, now - SESSION_MAX_MS))
            db.execute("INSERT INTO console_sessions VALUES (?, ?, ?, ?, ?)",
                       (_hash(sid), principal.token_id, csrf, now, now))
        return sid, Viewer(principal.tenant, principal.subject, principal.role,
                           principal.token_id, csrf)

    def viewer(self, sid: str | None) -> Viewer | None:
        """The signed-in person of cookie value ``sid``; ``None`` when expired, unknown or its
        token was revoked."""
        if not sid or len(sid) > 100:
            return None
        now = _now()
        with self._db() as db:
            row = db.execute("SELECT token_id, csrf, created_at, seen_at FROM console_sessions "
                             "WHERE id_hash = ?", (_hash(sid),)).fetchone()
            if row is None or row[3] < now - SESSION_IDLE_MS or row[2] < now - SESSION_MAX_MS:
                return None
            info = self.tokens.info(row[0])
            if info is None or info.revoked_at is not None or info.role not in CONSOLE_ROLES:
                db.execute("DELETE FROM console_sessions WHERE id_hash = ?", (_hash(sid),))
                return None
            if now - row[3] > 60_000:  # refresh the idle clock at most once a minute
                db.execute("UPDATE console_sessions SET seen_at = ? WHERE id_hash = ?",
                           (now, _hash(sid)))
        return Viewer(info.tenant, info.subject, info.role, info.token_id, row[1])

    def sign_out(self, sid: str | None) -> None:
        if sid:
            with self._db() as db:
                db.execute("DELETE FROM console_sessions WHERE id_hash = ?", (_hash(sid),))


def _secret(path: Path) -> bytes:
    """The console's signing secret (32 random bytes, 0600), shared by every worker."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        data = path.read_bytes()
        if len(data) < 32:
            raise ValueError(f"console secret `{path}` is shorter than 32 bytes: delete it and "
                             "restart (sign-in forms then made are refused)") from None
        return data[:32]
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_bytes(32))
    return path.read_bytes()[:32]


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())


def _hash(sid: str) -> str:
    # the cookie value is 256 random bits: one SHA-256 keeps a stolen table useless
    return hashlib.sha256(sid.encode()).hexdigest()


def _now() -> int:
    return int(time.time() * 1000)
