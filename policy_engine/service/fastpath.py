"""`POST /v1/decide` and `POST /v1/ops` without FastAPI's per-request machinery; anything
unusual goes to the routes.

A decision costs ~0.1 ms; FastAPI's routing, dependency solving and exception middleware cost
about as much again on every request (docs/benchmarks.md, "HTTP service"). Decide and ops are
the hot routes, so this ASGI layer answers their ordinary case itself with the *same* functions
the routes call (admission, the decision or the run, the error documents) and hands the request
to FastAPI, body replayed, whenever the answer would involve anything else.

Admission (token, then rate limit) comes first, before the body is looked at, as in the app
(``guards.AdmitFirst``): a missing or bad token and a rate-limit refusal are answered here with
the exception handlers' own documents (``error_response``). An admitted request is handed to
FastAPI, the principal riding along in the ASGI scope so it is not admitted (and charged) twice,
when its ``Content-Type`` is not exactly ``application/json``, its query string is not one of
``decide_answer``'s exact forms (``explain=full``, ``explain=compact``, none; `/v1/ops`: none),
its body is empty or not a JSON object (FastAPI's 422), or the body fails validation (FastAPI's
422). Every refusal of the decision or the run itself is answered here; a run goes through the
same thread pool as the route's (``run_in_threadpool``), one call of ``Gateway.run`` as before,
except a call that ``on_loop`` says runs start to end on local memory and files (an fs read or
listing: ``Gateway.runs_on_caller``), which is run on the event loop as a decision is: a
hand-off to a thread and back cost more than the call (docs/benchmarks.md, "Eleventh pass").

The body is validated straight from its bytes (``model_validate_json``: no Python dict built
first). pydantic's JSON parser refuses a little more than ``json.loads`` (a byte-order mark,
escaped lone surrogates, other encodings), never less except integers longer than
``json.loads`` takes (4300 digits), which are sent the old way; whatever it refuses is parsed
with ``json.loads`` and validated again, so each body gets the answer the route gives.
``tests/integration/test_service_fastpath.py`` sends the same requests through both paths and
compares status, headers and bodies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from policy_engine.model.text import SURROGATE_FREE, surrogate_free_json
from policy_engine.refusal import PolicyRefusal
from policy_engine.service.decide_answer import View, view_of_query
from policy_engine.service.errors import (
    ServiceError,
    crash_response,
    error_response,
    refused_response,
)
from policy_engine.service.guards import (
    ADMITTED,
    admit_or_answer,
    replaying,
    send_error,
    too_large,
)
from policy_engine.service.models import CallBody, DecideBody
from policy_engine.tokens import Principal

_DECIDE, _OPS = "/v1/decide", "/v1/ops"
# json.loads refuses integers longer than this (sys.get_int_max_str_digits); pydantic's parser
# takes some of them: such a body goes the json.loads way, as the route parses it
_LONG_INT = re.compile(rb"[0-9]{4301}")
_Body = TypeVar("_Body", bound=BaseModel)
_TOO_LARGE = b"<over the limit>"  # compared by identity


@dataclass(frozen=True)
class FastRoutes:
    """What the fast path shares with the FastAPI routes of `/v1/decide` and `/v1/ops`.

    :param admit: authenticate the ``Authorization`` header and charge the tenant's rate limit
        (raises ``ServiceError``).
    :param decide: the answer (``decide_answer``, in the view asked for) to a validated body
        for a principal (raises ``ServiceError`` for a refusal that is not a decision).
    :param run: the `/v1/ops` answer to a validated body for a principal (blocking: it runs in
        the thread pool; raises ``ServiceError`` as the route does).
    :param on_loop: whether ``run`` of this body may run on the event loop (it waits on
        nothing but local memory and files, and stops by its deadline by itself).
    :param run_on_loop: ``run`` of a body ``on_loop`` just said yes for (``run`` if not
        given): the run need not ask its own backend's check again.
    """

    admit: Callable[[str | None], Awaitable[Principal]]
    decide: Callable[[DecideBody, Principal, View], dict[str, Any]]
    run: Callable[[CallBody, Principal], Response]
    on_loop: Callable[[CallBody], bool] = lambda _: False
    run_on_loop: Callable[[CallBody, Principal], Response] | None = None


class FastPath:
    """ASGI middleware in front of the FastAPI app: serves ordinary `POST /v1/decide` and
    `POST /v1/ops` calls."""

    def __init__(self, app: ASGIApp, routes: FastRoutes, max_body_bytes: int) -> None:
        self.app = app
        self.routes = routes
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        path, query = scope["path"], scope.get("query_string", b"")
        view: View | None = None
        if path == _DECIDE:
            view = view_of_query(query)
        elif path == _OPS and not query:
            view = "compact"  # unused: ops has one answer
        raw = scope.get("raw_path")
        if view is None or (raw is not None and raw.split(b"?", 1)[0] != path.encode()):
            # another path or query (the route validates it), or a target written another
            # way (`/v1%2fops`: the exact-request check answers it)
            await self.app(scope, receive, send)
            return
        auth: str | None = None
        ctype: bytes | None = None
        auths, declared_over = 0, False
        for key, value in scope["headers"]:  # the first of each, as starlette's Headers.get
            if key == b"authorization":
                auths += 1
                if auth is None:
                    auth = value.decode("latin-1")
            elif key == b"content-type" and ctype is None:
                ctype = value
            elif key == b"content-length":
                declared_over |= not value.isdigit() or int(value) > self.limit
        if auths > 1 or declared_over:
            await self.app(scope, receive, send)  # the exact-request check or the body limit
            return
        body = await _read_body(receive, self.limit)
        if body is None:
            return  # the client went away
        if body is _TOO_LARGE:
            await send_error(send, too_large(self.limit))
            return
        replay = replaying(body, receive)
        who = await admit_or_answer(self.routes.admit, auth, scope, replay, send)
        if who is None:
            return
        response: Response
        try:
            if path == _DECIDE:
                decide_body = _parsed(DecideBody, body) if ctype == b"application/json" else None
                if decide_body is None:
                    await self.app({**scope, ADMITTED: who}, replay, send)
                    return
                response = JSONResponse(self.routes.decide(decide_body, who, view))
            else:
                call_body = _parsed(CallBody, body) if ctype == b"application/json" else None
                if call_body is None:
                    await self.app({**scope, ADMITTED: who}, replay, send)
                    return
                routes = self.routes
                response = (routes.run_on_loop or routes.run)(call_body, who) \
                    if routes.on_loop(call_body) \
                    else await run_in_threadpool(routes.run, call_body, who)
        except ServiceError as exc:
            response = error_response(exc)
        except PolicyRefusal as exc:
            response = refused_response(exc)
        except Exception as exc:  # noqa: BLE001
            response = crash_response(exc)
        await response(scope, replay, send)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body; ``None`` when the client left, ``_TOO_LARGE`` (unread past the limit,
    as ``BodyLimit`` reads) when it grew over ``limit`` bytes."""
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            return _TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


_SCANNED = {SURROGATE_FREE: True}


def _parsed(model: type[_Body], body: bytes) -> _Body | None:
    """``body`` validated as ``model``, or ``None`` for anything FastAPI should answer itself
    (not a JSON object, or invalid)."""
    if not body:
        return None
    if len(body) <= 4300 or _LONG_INT.search(body) is None:
        try:
            # a body with no surrogate escape cannot hold a lone surrogate: the models' walk
            # of every string for one is skipped (``model/text.py``)
            return model.model_validate_json(
                body, context=_SCANNED if surrogate_free_json(body) else None)
        except ValidationError:
            pass  # perhaps JSON pydantic's parser refuses and json.loads takes: parse again
    data = _json_object(body)
    if data is None:
        return None
    try:
        return model.model_validate(data, from_attributes=True)
    except ValidationError:
        return None


def _json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or ``None`` for anything FastAPI should answer itself."""
    try:
        data = json.loads(body)  # what starlette's Request.json does
    except Exception:  # noqa: BLE001 — JSON, encoding or nesting errors: the route answers
        return None
    return data if isinstance(data, dict) else None
