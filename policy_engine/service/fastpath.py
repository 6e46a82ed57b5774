"""`POST /v1/decide` without FastAPI's per-request machinery; anything unusual goes to the route.

A decision costs ~0.1 ms; FastAPI's routing, dependency solving and exception middleware cost
about as much again on every request (docs/benchmarks.md, "HTTP service"). The decide route is
the hot one, so this ASGI layer answers the ordinary case itself with the *same* functions the
route calls (admission, the decision, the error documents) and hands the request to FastAPI,
body replayed, whenever the answer would involve anything else.

Admission (token, then rate limit) comes first, before the body is looked at, as in the app
(``guards.AdmitFirst``): a missing or bad token and a rate-limit refusal are answered here with
the exception handlers' own documents (``error_response``). An admitted request is handed to
FastAPI, the principal riding along in the ASGI scope so it is not admitted (and charged) twice,
when its ``Content-Type`` is not exactly ``application/json``, its query string is not one of
``decide_answer``'s exact forms (``explain=full``, ``explain=compact``, none), its body is
empty or not a JSON object (FastAPI's 422), or the body fails validation (FastAPI's 422).
Every refusal of the decision itself is answered here.
``tests/integration/test_service_fastpath.py`` sends the same requests through both paths and
compares status, headers and bodies.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from policy_engine.service.decide_answer import View, view_of_query
from policy_engine.service.errors import ServiceError, crash_response, error_response
from policy_engine.service.guards import ADMITTED, admit_or_answer, replaying
from policy_engine.service.models import DecideBody
from policy_engine.tokens import Principal

_PATH = "/v1/decide"


@dataclass(frozen=True)
class DecideRoute:
    """What the fast path shares with the FastAPI route of `/v1/decide`.

    :param admit: authenticate the ``Authorization`` header and charge the tenant's rate limit
        (raises ``ServiceError``).
    :param decide: the answer (``decide_answer``, in the view asked for) to a validated body
        for a principal (raises ``ServiceError`` for a refusal that is not a decision).
    """

    admit: Callable[[str | None], Awaitable[Principal]]
    decide: Callable[[DecideBody, Principal, View], dict[str, Any]]


class DecideFastPath:
    """ASGI middleware in front of the FastAPI app: serves ordinary `POST /v1/decide` calls."""

    def __init__(self, app: ASGIApp, route: DecideRoute) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != _PATH
                or scope.get("root_path")):
            await self.app(scope, receive, send)
            return
        view = view_of_query(scope.get("query_string", b""))
        if view is None:  # another query: the route validates it
            await self.app(scope, receive, send)
            return
        auth: str | None = None
        ctype: bytes | None = None
        for key, value in scope["headers"]:  # the first of each, as starlette's Headers.get
            if key == b"authorization" and auth is None:
                auth = value.decode("latin-1")
            elif key == b"content-type" and ctype is None:
                ctype = value
        body = await _read_body(receive)
        if body is None:
            return  # the client went away
        replay = replaying(body, receive)
        who = await admit_or_answer(self.route.admit, auth, scope, replay, send)
        if who is None:
            return
        data = _json_object(body) if ctype == b"application/json" else None
        if data is None:
            await self.app({**scope, ADMITTED: who}, replay, send)
            return
        try:
            parsed = DecideBody.model_validate(data, from_attributes=True)
        except ValidationError:
            await self.app({**scope, ADMITTED: who}, replay, send)
            return
        try:
            response = JSONResponse(self.route.decide(parsed, who, view))
        except ServiceError as exc:
            response = error_response(exc)
        except Exception as exc:  # noqa: BLE001
            response = crash_response(exc)
        await response(scope, replay, send)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (bounded by ``BodyLimit`` in front); ``None`` when the client left."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or ``None`` for anything FastAPI should answer itself."""
    if not body:
        return None
    try:
        data = json.loads(body)  # what starlette's Request.json does
    except Exception:  # noqa: BLE001 — JSON, encoding or nesting errors: the route answers
        return None
    return data if isinstance(data, dict) else None
