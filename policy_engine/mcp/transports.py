"""The MCP server's transports: stdio as one configured tenant, streamable HTTP behind the
service's bearer tokens."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp.server import Server
from mcp.server.context import ServerRequestContext
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from policy_engine.mcp.server import PrincipalOf, Unauthenticated
from policy_engine.mcp.stdio import bounded_stdio
from policy_engine.service.errors import ServiceError
from policy_engine.serving import bound_worker_threads, limit_malloc_arenas
from policy_engine.tokens import Principal, TokenStore

_SCOPE_KEY = "policy_engine.principal"


def fixed_principal(tenant: str, subject: str) -> PrincipalOf:
    """stdio: the one tenant and subject the operator configured (the host that launched the
    process is the only client)."""

    def principal_of(_: ServerRequestContext[Any, Any]) -> tuple[str, str]:
        return tenant, subject

    return principal_of


def token_principal(tokens: TokenStore) -> PrincipalOf:
    """HTTP: the token of the very request carrying the call, checked again for each message
    (a token revoked mid-session stops working on its next call)."""

    def principal_of(ctx: ServerRequestContext[Any, Any]) -> tuple[str, str]:
        scope = getattr(ctx.request, "scope", None)
        who = _authenticate(tokens, _header(scope)) if isinstance(scope, dict) else None
        if who is None:
            raise Unauthenticated()
        return who.tenant, who.subject

    return principal_of


def _header(scope: Scope, name: bytes = b"authorization") -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _authenticate(tokens: TokenStore, header: str | None) -> Principal | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return tokens.authenticate(value.strip()) if scheme.lower() == "bearer" else None


class RequireToken:
    """ASGI middleware: a request without a valid service token gets ``401
    AUTH.UNAUTHENTICATED`` before the MCP transport (or a session) sees it, and a session
    belongs to the tenant and subject whose token opened it: another token naming its
    ``Mcp-Session-Id`` gets ``404``, as for a session that does not exist."""

    def __init__(self, app: ASGIApp, tokens: TokenStore, max_sessions: int = 10_000,
                 admit: Callable[[Principal], None] | None = None) -> None:
        self.app = app
        self.tokens = tokens
        self.admit = admit
        self.owners: dict[str, tuple[str, str]] = {}
        self.max_sessions = max_sessions
        self._bounded = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._bounded:  # the first event in the server's loop: bound its worker pool
            self._bounded = True
            bound_worker_threads()
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        who = _authenticate(self.tokens, _header(scope))
        if who is None:
            await _refuse(send, 401, "AUTH.UNAUTHENTICATED", "authentication required: send "
                          "`Authorization: Bearer <token>`")
            return
        if self.admit is not None:
            try:
                self.admit(who)
            except ServiceError as err:  # over the tenant's rate, or the meter is down
                await _refuse(send, err.http_status, err.code, err.message)
                return
        owner = (who.tenant, who.subject)
        session = _header(scope, b"mcp-session-id")
        if session is not None and self.owners.get(session) != owner:
            await _refuse(send, 404, "SERVICE.NOT_FOUND", "not found: no such session")
            return
        scope[_SCOPE_KEY] = who

        async def claim(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", ()):
                    if key.lower() == b"mcp-session-id":
                        self._own(bytes(value).decode("latin-1"), owner)
            await send(message)

        await self.app(scope, receive, claim)

    def _own(self, session: str, owner: tuple[str, str]) -> None:
        self.owners.setdefault(session, owner)
        while len(self.owners) > self.max_sessions:  # the oldest first
            self.owners.pop(next(iter(self.owners)))


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "http_status": status, "retryable": False,
                                 "message": message}}).encode()
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="policy-engine"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def run_stdio(server: Server[Any]) -> None:
    """Serve one host over this process's stdin/stdout until it closes them, at most
    :data:`~policy_engine.serving.MAX_CONCURRENT_CALLS` calls at once (the rest wait), each
    JSON-RPC line at most :data:`~policy_engine.mcp.stdio.MAX_LINE_BYTES`."""
    limit_malloc_arenas()
    bound_worker_threads()
    async with bounded_stdio() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_app(server: Server[Any], tokens: TokenStore, *, host: str, path: str = "/mcp",
             admit: Callable[[Principal], None] | None = None) -> ASGIApp:
    """The streamable HTTP app at ``path`` (DNS-rebinding protection on for loopback hosts),
    wrapped in the token check; ``admit`` may refuse a principal's request (rate limits)."""
    limit_malloc_arenas()
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    return RequireToken(app, tokens, admit=admit)
