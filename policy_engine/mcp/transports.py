"""The MCP server's transports: stdio as one configured tenant, streamable HTTP behind the
service's bearer tokens."""

from __future__ import annotations

import json
from typing import Any

from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from starlette.types import ASGIApp, Receive, Scope, Send

from policy_engine.mcp.server import PrincipalOf, Unauthenticated
from policy_engine.service.tokens import Principal, TokenStore

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


def _header(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            return bytes(value).decode("latin-1")
    return None


def _authenticate(tokens: TokenStore, header: str | None) -> Principal | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return tokens.authenticate(value.strip()) if scheme.lower() == "bearer" else None


class RequireToken:
    """ASGI middleware: a request without a valid service token gets ``401
    AUTH.UNAUTHENTICATED`` before the MCP transport (or a session) sees it."""

    def __init__(self, app: ASGIApp, tokens: TokenStore) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        who = _authenticate(self.tokens, _header(scope))
        if who is None:
            body = json.dumps({"error": {"code": "AUTH.UNAUTHENTICATED", "http_status": 401,
                                         "retryable": False, "message": "authentication "
                                         "required: send `Authorization: Bearer <token>`"}})
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer realm="policy-engine"')]})
            await send({"type": "http.response.body", "body": body.encode()})
            return
        scope[_SCOPE_KEY] = who
        await self.app(scope, receive, send)


async def run_stdio(server: Server[Any]) -> None:
    """Serve one host over this process's stdin/stdout until it closes them."""
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_app(server: Server[Any], tokens: TokenStore, *, host: str,
             path: str = "/mcp") -> ASGIApp:
    """The streamable HTTP app at ``path`` (DNS-rebinding protection on for loopback hosts),
    wrapped in the token check."""
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    return RequireToken(app, tokens)
