"""The browser executor's work on the browser thread: a session's context, one op, a screenshot.

Imported by ``executor.BrowserExecutor`` when it serves its first call, with Playwright: a start
of the engine that serves no browser op loads neither.
"""

from __future__ import annotations

import base64
import contextlib
import re
import secrets
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Page, Request, Route, WebSocketRoute
from playwright.sync_api import Error as PlaywrightError

from plugins.executor_browser import capture, lockdown
from plugins.executor_browser.executor import BrowserExecutor, _limit, session_key
from plugins.executor_browser.host import BrowserHost, Session
from plugins.executor_browser.navigate import RequestGate, navigate
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import BrowserNavOp, BrowserScreenshotOp, Digest, Profile


def on_browser(ex: BrowserExecutor, host: BrowserHost, ctx: ExecContext,
               op: BrowserNavOp | BrowserScreenshotOp) -> dict[str, Any]:
    """Run ``op`` in the caller's session (made on first use); a Playwright error drops the
    session, or the browser when it crashed, and fails the call."""
    key = session_key(ctx.profile)
    try:
        sess = host.session(key, lambda browser, holder: new_context(ex, browser, holder))
        return run_op(ex, sess, ctx, op)
    except PlaywrightError as exc:
        crashed = not host.alive()
        if crashed:
            host.kill_browser()  # relaunched by the next job
        else:
            host.drop_session(key)
        reason = "browser crashed" if crashed else "browser operation failed"
        raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, reason,
                                audit={"error": str(exc)[:2000]}) from None


def new_context(ex: BrowserExecutor, browser: Browser, holder: dict[str, Any]) -> BrowserContext:
    context = browser.new_context(
        accept_downloads=False, service_workers="block",
        java_script_enabled=ex.options.javascript, locale="en-US", timezone_id="UTC",
        viewport={"width": 1280, "height": 720}, permissions=[],
    )
    holder["gate"] = None
    # before any page script: no peer-to-peer or QUIC API the request gate cannot see
    context.add_init_script(script=lockdown.INIT_SCRIPT)

    def route(route: Route, request: Request) -> None:
        gate = holder["gate"]
        if gate is None:
            lockdown.abort_quietly(route)
        else:
            gate.handle(route, request)

    def refuse_socket(ws: WebSocketRoute) -> None:
        gate = holder["gate"]
        if gate is not None:
            gate.record(ws.url, "websocket", "websockets are refused")
        with contextlib.suppress(PlaywrightError):
            ws.close(code=1008, reason="refused by policy")

    def on_page(page: Page) -> None:
        page.on("download", lambda d: holder["gate"].on_download(d)
                if holder["gate"] else None)
        page.on("popup", lambda popup: lockdown.close_popup(popup, holder["gate"]))

    context.route("**/*", route)
    context.route_web_socket(re.compile(".*"), refuse_socket)
    context.on("page", on_page)
    return context


def run_op(ex: BrowserExecutor, sess: Session, ctx: ExecContext,
           op: BrowserNavOp | BrowserScreenshotOp) -> dict[str, Any]:
    profile = ctx.profile
    holder = sess.slot
    gate = RequestGate(
        page=sess.page, profile=profile, rules=ex.rules,
        max_depth=_limit(ctx, "max_depth"), max_bytes_in=_limit(ctx, "max_bytes_in"),
        deadline=ctx.deadline, guard=ctx.guard,
        screenshot=isinstance(op, BrowserScreenshotOp),
    )
    holder["gate"] = ex._active = gate
    sess.page.set_default_timeout(gate.remaining_ms())
    lockdown.close_other_pages(sess.context, sess.page, None)  # opened after the last op
    try:
        try:
            status = navigate(gate, op.url) if op.url is not None else None
        except PolicyEngineError:
            # a refused navigation leaves Chromium's error page pending: start clean
            sess.page.close()
            sess.page = sess.context.new_page()
            raise
        if op.url is None and sess.page.url in ("", "about:blank"):
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    "no page is open in this session: give a `url`")
        out: dict[str, Any] = {"url": sess.page.url, "status": status,
                               "title": sess.page.title()}
        if isinstance(op, BrowserNavOp):
            if op.extract == "text":
                out.update(capture.extract_text(sess.page, ex.options.max_text_bytes))
            elif op.extract == "links":
                out.update(capture.extract_links(sess.page, ex.options.max_links))
        else:
            out.update(screenshot(ex, sess, ctx, op, gate))
    finally:
        lockdown.close_other_pages(sess.context, sess.page, gate)
        gate.active = False
        holder["gate"] = ex._active = None
    out.update(requests=gate.requests, navigations=gate.navigations, hops=gate.hops,
               blocked=list(gate.blocked), _bytes_in=gate.bytes_in)
    return out


def screenshot(ex: BrowserExecutor, sess: Session, ctx: ExecContext, op: BrowserScreenshotOp,
               gate: RequestGate) -> dict[str, Any]:
    max_w = _limit(ctx, "max_screenshot_width")
    max_h = _limit(ctx, "max_screenshot_height")
    png, clipped = capture.screenshot(sess.page, op, max_w, max_h, gate.remaining_ms())
    width, height = capture.png_size(png)
    path = _save(ex.options.screenshot_dir, ctx.profile, png)
    return {"digest": Digest.of(png).model_dump(), "path": str(path) if path else None,
            "width": width, "height": height, "clipped": clipped,
            "png_b64": None if path else base64.b64encode(png).decode("ascii")}


def _save(where: Path | None, profile: Profile, png: bytes) -> Path | None:
    if where is None:
        return None
    where.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", profile.call_id)[:80] or "call"
    path = where / f"{safe}-{secrets.token_hex(6)}.png"
    path.write_bytes(png)
    return path
