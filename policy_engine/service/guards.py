"""Request admission: bearer authentication, per-tenant rate limits and the body-size cap."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from policy_engine.budget import BudgetMeter, counts_windows
from policy_engine.errors import PolicyEngineError
from policy_engine.service.errors import (
    ServiceError,
    crash_response,
    error_response,
    from_engine,
    service_error,
)
from policy_engine.tokens import Principal, TokenStore

ADMITTED = "policy_engine.admitted"
"""ASGI scope key: the principal this request was already admitted as (set only by the
service's own layers; a client cannot write scope keys)."""


def authenticate(tokens: TokenStore, header: str | None) -> Principal:
    """The principal of an ``Authorization: Bearer <token>`` header.

    :raises ServiceError: ``AUTH.UNAUTHENTICATED`` (the same for missing, malformed, unknown
        and revoked tokens: a caller learns nothing about which tokens exist).
    """
    if not header:
        raise service_error("AUTH.UNAUTHENTICATED", "send `Authorization: Bearer <token>`")
    scheme, _, value = header.partition(" ")
    principal = tokens.authenticate(value.strip()) if scheme.lower() == "bearer" else None
    if principal is None:
        raise service_error("AUTH.UNAUTHENTICATED", "the token is not valid")
    return principal


def charge_rate(meter: BudgetMeter, tenant: str, per_minute: int,
                now: float | None = None) -> None:
    """Count one request of ``tenant`` in the current minute through the budget meter (so
    replicas sharing a meter share the limit): its ``WindowCounter`` when it has one (the SQLite
    meter's shared-memory table, ≈ 5 µs instead of a ≈ 50 µs write transaction), else one
    ``check_and_consume`` of the key ``service-rate/<tenant>/<minute>``.

    :raises ServiceError: ``QUOTA.BUDGET_EXCEEDED`` (429) over the limit;
        ``PROVIDER.UNAVAILABLE`` when the meter cannot be read (fails closed).
    """
    window = int((now if now is not None else time.time()) // 60)
    try:
        if counts_windows(meter):  # exact across processes, no durable write
            meter.charge_window(f"service-rate/{tenant}", window, per_minute)
        else:
            meter.check_and_consume(f"service-rate/{tenant}/{window}", "calls", 1, per_minute)
    except PolicyEngineError as exc:
        if exc.code.value == "QUOTA.BUDGET_EXCEEDED":
            exc = PolicyEngineError(exc.code, f"more than {per_minute} requests a minute "
                                    f"for tenant `{tenant}`")
        raise from_engine(exc) from None


class AdmitFirst:
    """ASGI middleware: a request for a path that takes a token is admitted (token, then rate
    limit) before anything reads its body, so a caller without a valid token gets 401 whatever
    the body holds (outsider round 4 F02: FastAPI parses the body before it solves the
    dependencies, so broken JSON got 422 and undecodable JSON 404 without a token).

    :param guarded: the path patterns of the routes that take a token (any method: a wrong
        method is 405 only for a caller with a token).
    :param admit: authenticate the ``Authorization`` header and charge the rate limit
        (raises ``ServiceError``).
    """

    def __init__(self, app: ASGIApp, guarded: Sequence[re.Pattern[str]],
                 admit: Callable[[str | None], Awaitable[Principal]]) -> None:
        self.app = app
        self.guarded = tuple(guarded)
        self.admit = admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or ADMITTED in scope
                or not any(p.match(scope["path"]) for p in self.guarded)):
            await self.app(scope, receive, send)
            return
        auth = next((v.decode("latin-1") for k, v in scope["headers"]
                     if k == b"authorization"), None)  # the first, as starlette's Headers.get
        who = await admit_or_answer(self.admit, auth, scope, receive, send)
        if who is not None:
            await self.app({**scope, ADMITTED: who}, receive, send)


async def admit_or_answer(admit: Callable[[str | None], Awaitable[Principal]], auth: str | None,
                          scope: Scope, receive: Receive, send: Send) -> Principal | None:
    """The principal ``admit`` names for ``auth``, or ``None`` once the refusal (or, for a crash
    of the check, the app's catch-all 500) has been sent."""
    try:
        return await admit(auth)
    except ServiceError as exc:
        await error_response(exc)(scope, receive, send)
    except Exception as exc:  # noqa: BLE001 — answered like the app's catch-all handler
        await crash_response(exc)(scope, receive, send)
    return None


class ExactRequest:
    """ASGI middleware, outermost: a request target with an encoded ``/`` or ``\\`` is no
    endpoint (uvicorn decodes ``/v1%2fops`` to ``/v1/ops``, which a path-based proxy rule in
    front of the service would not recognise), and a request with more than one
    ``Authorization`` header is refused (a proxy and the service could each read another one).
    Outsider round 5, F05."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = (scope.get("raw_path") or b"").split(b"?", 1)[0].lower()
            if b"%2f" in raw or b"%5c" in raw:
                await send_error(send, service_error("SERVICE.NOT_FOUND", "no such endpoint"))
                return
            if sum(1 for k, _ in scope["headers"] if k == b"authorization") > 1:
                await send_error(send, service_error(
                    "SERVICE.BAD_REQUEST", "more than one Authorization header; send one"))
                return
        await self.app(scope, receive, send)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read ``body`` over once, then the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is answered 413 before the app reads it all
    (a ``Content-Length`` over the limit is refused without reading anything)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.limit + 1
                if declared > self.limit:
                    await send_error(send, self._error())
                    return
        # read the whole (bounded) body first: an app that fails half-way through reading
        # would answer 500, and a refusal must be a clean 413
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await send_error(send, self._error())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replaying(b"".join(chunks), receive), send)

    def _error(self) -> ServiceError:
        return too_large(self.limit)


def too_large(limit: int) -> ServiceError:
    """The 413 of a body over ``limit`` bytes."""
    return service_error("SERVICE.PAYLOAD_TOO_LARGE",
                         f"request bodies are limited to {limit} bytes")


async def send_error(send: Send, err: ServiceError) -> None:
    """Answer ``err`` with nothing read or called before (no app, no request object)."""
    import json

    body = json.dumps(err.body()).encode()
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())]
    start: dict[str, Any] = {"type": "http.response.start", "status": err.http_status,
                             "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
