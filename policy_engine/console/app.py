"""The console's pages: each parses its input, reads the index, queue or policy, and renders.

Server-rendered HTML (Jinja2, autoescaped) with one static script for live approval updates:
no inline script or style, so the Content-Security-Policy allows only this origin's files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from policy_engine.confirm.queue import LateAnswer, SelfApproval
from policy_engine.console import render
from policy_engine.console.auth import COOKIE, PRE_COOKIE, SignInError, Viewer, csrf_ok
from policy_engine.console.charts import bars_svg, series_svg
from policy_engine.console.context import ConsoleContext
from policy_engine.console.forms import BadInput, answer_form, call_query
from policy_engine.console.policychange import candidate_report_bounded
from policy_engine.refusal import code_refusal
from policy_engine.replay.engine import RecordedCall

log = logging.getLogger(__name__)
MAX_FORM_BYTES = 1 << 20
CHART_MS = 48 * 3_600_000
FORBIDDEN = "SANDBOX.PERMISSION_DENY"
"""A console refusal of a role or a CSRF token: the registry's 403 (docs/error-codes.md)."""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
STATIC = Path(__file__).with_name("static")
Handler = Callable[[Request], Awaitable[Response]]


_SECURITY_HEADERS = [(b"content-security-policy", CSP.encode()),
                     (b"x-content-type-options", b"nosniff"),
                     (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]


class _Headers:
    """Security headers on every console answer (plain ASGI: a streamed answer stays a
    stream, and its end is seen when the browser leaves)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() not in {h for h, _ in _SECURITY_HEADERS}]
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers + _SECURITY_HEADERS}
            await send(message)

        await self.app(scope, receive, with_headers)


def console_app(ctx: ConsoleContext) -> Starlette:
    """The console as an ASGI app, mounted by ``serve --console`` under ``/console``."""

    def refuse(request: Request, status: int, code: str, message: str,
               field: str | None = None) -> Response:
        """The one refusal shape (docs/refusal.schema.json): JSON for programs, a page listing
        the same fields for people."""
        body = code_refusal(code, status, message, "service", location=field).to_json()
        if "text/html" in request.headers.get("accept", ""):
            return HTMLResponse(render.page("error.html", request, None, refusal=body),
                                status_code=status)
        return JSONResponse(body, status_code=status)

    def signed_in(role: str = "viewer") -> Callable[[Callable[..., Awaitable[Response]]],
                                                     Handler]:
        def wrap(view: Callable[..., Awaitable[Response]]) -> Handler:
            async def handler(request: Request) -> Response:
                who = await run_in_threadpool(ctx.sessions.viewer, request.cookies.get(COOKIE))
                if who is None:
                    if request.method == "GET" and "text/html" in request.headers.get("accept",
                                                                                       ""):
                        return RedirectResponse(f"{_base(request)}/login", status_code=303)
                    return refuse(request, 401, "AUTH.UNAUTHENTICATED", "sign in first")
                if not who.may(role):
                    return refuse(request, 403, FORBIDDEN,
                                  f"this page needs the `{role}` role; yours is `{who.role}`")
                if request.method == "POST":
                    form = await _form(request)
                    if form is None:
                        return refuse(request, 413, "SERVICE.PAYLOAD_TOO_LARGE",
                                      f"a form of at most {MAX_FORM_BYTES} bytes and 50 fields")
                    if not csrf_ok(who.csrf, form.get("csrf")):
                        return refuse(request, 403, FORBIDDEN,
                                      "the form's CSRF token is missing or stale: reload the "
                                      "page and submit again", "csrf")
                    request.state.form = form
                try:
                    return await view(request, who)
                except BadInput as exc:
                    return refuse(request, 422, "SCHEMA.VALIDATION_FAILED", str(exc), exc.field)
            return handler
        return wrap

    def scoped(filters: dict[str, str], who: Viewer) -> dict[str, str]:
        """``filters`` held to the viewer's tenant (422 when they name another)."""
        out = dict(filters)
        if who.scope is not None:
            if out["tenant"] and out["tenant"] != who.scope:
                raise BadInput("tenant", "you may only see your own tenant")
            out["tenant"] = who.scope
        return out

    async def login_page(request: Request) -> Response:
        given = request.cookies.get(PRE_COOKIE)
        # only a token this console made is kept (outsider round 13, L3)
        pre = given if given is not None and ctx.sessions.pre_ok(given) else \
            ctx.sessions.pre_token()
        page = HTMLResponse(render.page("login.html", request, None, csrf=pre, error=None))
        _cookie(page, request, PRE_COOKIE, pre, ctx.secure_cookies, max_age=900)
        return page

    async def login(request: Request) -> Response:
        form = await _form(request)
        pre = request.cookies.get(PRE_COOKIE)
        if form is None or pre is None or not ctx.sessions.pre_ok(pre) or \
                not csrf_ok(pre, form.get("csrf")):
            return refuse(request, 403, FORBIDDEN, "the sign-in form's CSRF token is missing or "
                          "stale: reload the sign-in page and try again", "csrf")
        try:
            sid, _who = await run_in_threadpool(ctx.sessions.sign_in, form.get("token", ""))
        except SignInError as exc:
            return HTMLResponse(render.page("login.html", request, None, csrf=pre,
                                            error=str(exc)), status_code=401)
        response = RedirectResponse(f"{_base(request)}/calls", status_code=303)
        _cookie(response, request, COOKIE, sid, ctx.secure_cookies, max_age=12 * 3600)
        response.delete_cookie(PRE_COOKIE, path=_base(request))
        return response

    @signed_in()
    async def logout(request: Request, who: Viewer) -> Response:
        await run_in_threadpool(ctx.sessions.sign_out, request.cookies.get(COOKIE))
        response = RedirectResponse(f"{_base(request)}/login", status_code=303)
        response.delete_cookie(COOKIE, path=_base(request))
        return response

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{_base(request)}/calls", status_code=303)

    @signed_in()
    async def calls(request: Request, who: Viewer) -> Response:
        query = call_query(request.query_params.multi_items())
        filters = scoped(query.filters, who)

        def read() -> tuple[Any, int]:
            # SQLite reads stay off the event loop (the count of unreadable records too)
            ctx.index.sync()
            return (ctx.index.page(filters, since=query.since, until=query.until,
                                   cursor=query.cursor, size=query.size),
                    ctx.index.unreadable())
        page, unreadable = await run_in_threadpool(read)
        return HTMLResponse(render.page("calls.html", request, who, query=query, page=page,
                                        unreadable=unreadable))

    @signed_in()
    async def call(request: Request, who: Viewer) -> Response:
        envelope = request.path_params["envelope_id"]
        if len(envelope) > 100:
            raise BadInput("envelope_id", "not an envelope id")
        found = await run_in_threadpool(ctx.index.call, envelope, who.scope)
        if found is None:  # another tenant's call is as absent as an unknown one
            return refuse(request, 404, "SERVICE.NOT_FOUND", "no such call")
        rule = (found.get("end") or {}).get("rule")
        source = render.rule_source(rule, ctx.policy_files, ctx.policyset())
        return HTMLResponse(render.page("call.html", request, who, call=found, rule=rule,
                                        source=source))

    @signed_in()
    async def charts(request: Request, who: Viewer) -> Response:
        query = call_query(request.query_params.multi_items())
        filters = scoped(query.filters, who)

        # without a range: the last 48 hours, the span of the hourly chart
        since = query.since if query.since is not None else int(time.time() * 1000) - CHART_MS

        def read() -> dict[str, Any]:
            ctx.index.sync()
            return ctx.index.stats(filters, since=since, until=query.until)
        stats = await run_in_threadpool(read)
        return HTMLResponse(render.page(
            "charts.html", request, who, query=query, stats=stats,
            series=series_svg(stats["series"], "calls and refusals per hour"),
            by_code=bars_svg([(r["code"], r["calls"]) for r in stats["by_code"]],
                             "refusals by code"),
            by_rule=bars_svg([(r["rule"], r["calls"]) for r in stats["by_rule"]],
                             "refusals by rule")))

    @signed_in()
    async def approvals(request: Request, who: Viewer) -> Response:
        rows = await run_in_threadpool(ctx.queue.list, tenant=who.scope)
        return HTMLResponse(render.page("approvals.html", request, who, rows=rows,
                                        now=int(time.time() * 1000)))

    @signed_in()
    async def approval(request: Request, who: Viewer) -> Response:
        rid = request.path_params["request_id"]
        row = await run_in_threadpool(ctx.queue.get, rid, who.scope)
        if row is None:
            return refuse(request, 404, "SERVICE.NOT_FOUND", "no such consent request")
        return HTMLResponse(render.page("approval.html", request, who, row=row,
                                        now=int(time.time() * 1000)))

    @signed_in("approver")
    async def answer(request: Request, who: Viewer) -> Response:
        rid = request.path_params["request_id"]
        form = answer_form(request.state.form)
        try:
            await run_in_threadpool(
                lambda: ctx.queue.answer(rid, approved=form.approve,
                                         approver=f"{who.subject} ({who.token_id})",
                                         note=form.reason, valid_for_ms=form.valid_for_ms,
                                         tenant=who.scope, approver_subject=who.subject))
        except SelfApproval:
            return refuse(request, 403, FORBIDDEN, "this call is your own: another approver "
                          "must answer it (consent needs a second person)")
        except LateAnswer:
            row = await run_in_threadpool(ctx.queue.get, rid, who.scope)
            if row is None:
                return refuse(request, 404, "SERVICE.NOT_FOUND", "no such consent request")
            return refuse(request, 409, "SERVICE.CONFLICT",
                          f"this request is `{row.status}`: the call no longer waits for an "
                          "answer, so yours was not recorded")
        return RedirectResponse(f"{_base(request)}/approvals/{rid}", status_code=303)

    @signed_in()
    async def approval_stream(request: Request, who: Viewer) -> Response:
        async def events() -> AsyncIterator[bytes]:
            last: tuple[int, str] | None = None
            deadline = time.monotonic() + 600  # the browser reconnects after ten minutes
            sid = request.cookies.get(COOKIE)
            while time.monotonic() < deadline and not await request.is_disconnected():
                # the session is read again each time: a revoked token ends the stream
                if await run_in_threadpool(ctx.sessions.viewer, sid) is None:
                    yield b"event: signed-out\ndata: {}\n\n"
                    return
                rows = await run_in_threadpool(ctx.queue.list, tenant=who.scope,
                                               status="pending", limit=1)
                count = await run_in_threadpool(ctx.queue.pending_count, who.scope)
                now = (count, rows[0].request_id if rows else "")
                if now != last:
                    last = now
                    data = json.dumps({"pending": count, "newest": now[1]})
                    yield f"event: pending\ndata: {data}\n\n".encode()
                await asyncio.sleep(1.0)
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @signed_in()
    async def policy(request: Request, who: Viewer) -> Response:
        return HTMLResponse(render.page("policy.html", request, who, policyset=ctx.policyset(),
                                        files=ctx.policy_files, report=None, candidate=""))

    @signed_in("admin")
    async def candidate(request: Request, who: Viewer) -> Response:
        source = request.state.form.get("source", "")
        if not source.strip():
            raise BadInput("source", "paste the candidate policy's text")
        current = ctx.policyset()
        entries = [str(f) for f in (ctx.policy_files or current.files[:1])]

        def work() -> Any:
            ctx.index.sync()
            recent = _recent_calls(ctx, limit=200)
            # its own process, stopped past a deadline: a knotty candidate never holds a
            # server thread (outsider round 13, L1)
            return candidate_report_bounded(entries, source, recent, ctx.state_dir)
        report = await run_in_threadpool(work)
        return HTMLResponse(render.page("policy.html", request, who, policyset=current,
                                        files=ctx.policy_files, report=report,
                                        candidate=source))

    routes = [
        Route("/", home), Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]), Route("/logout", logout, methods=["POST"]),
        Route("/calls", calls), Route("/calls/{envelope_id}", call), Route("/charts", charts),
        Route("/approvals", approvals), Route("/approvals/stream", approval_stream),
        Route("/approvals/{request_id}", approval, methods=["GET"]),
        Route("/approvals/{request_id}", answer, methods=["POST"]),
        Route("/policy", policy, methods=["GET"]),
        Route("/policy/candidate", candidate, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return refuse(request, 404, "SERVICE.NOT_FOUND", "no such console page")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return refuse(request, 405, "SERVICE.METHOD_NOT_ALLOWED", "method not allowed here")

    async def crashed(request: Request, exc: Exception) -> Response:
        log.exception("console: %s %s failed", request.method, request.url.path)
        return refuse(request, 500, "UNKNOWN.INTERNAL",
                      "the console failed on this page; the server log says why")

    return Starlette(routes=routes, middleware=[Middleware(_Headers)],
                     exception_handlers={404: not_found, 405: not_allowed, 500: crashed})


def _recent_calls(ctx: ConsoleContext, limit: int) -> list[RecordedCall]:
    """The newest ``limit`` calls the viewer's index holds, their records re-read."""
    page = ctx.index.page({}, size=limit)
    out = []
    for row in page.rows:
        found = ctx.index.call(row["envelope_id"], None)
        if found and found.get("begin"):
            out.append(RecordedCall(row["envelope_id"], found["begin"], found.get("end")))
    return out


async def _form(request: Request) -> dict[str, str] | None:
    """The url-encoded form of ``request`` (at most :data:`MAX_FORM_BYTES`), or ``None``."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True,
                          max_num_fields=50)
    except ValueError:  # more fields than any console form has
        return None
    return dict(pairs)


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _cookie(response: Response, request: Request, name: str, value: str, secure: bool,
            max_age: int) -> None:
    tls = secure or request.url.scheme == "https"
    response.set_cookie(name, value, max_age=max_age, path=_base(request) or "/",
                        httponly=True, secure=tls, samesite="strict")
