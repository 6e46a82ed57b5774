"""The `browser` executor: read-only navigation, extraction and screenshots in headless Chromium.

One browser instance (``host.BrowserHost``) serves every session; each session has a fresh
context. Downloads are refused, nothing from an op is injected into a page, and every request is
vetted by the host rules (``rules.RequestRules``) before it is fetched.
"""

from __future__ import annotations

import base64
import contextlib
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Page, Request, Route, WebSocketRoute
from playwright.sync_api import Error as PlaywrightError

from plugins.executor_browser import capture, lockdown
from plugins.executor_browser.host import BrowserHost, Session
from plugins.executor_browser.navigate import RequestGate, navigate
from plugins.executor_browser.rules import DecidesOps, RequestRules
from plugins.executor_browser.sink import RefusingProxy
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.evidence import redact_url
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    BrowserNavOp,
    BrowserScreenshotOp,
    Digest,
    ExecOp,
    ExecResult,
    NetworkMode,
    OpKind,
    Profile,
    SideEffect,
    SideEffectRec,
    Usage,
)

_OPTION_KEYS = frozenset({"executable", "screenshot_dir", "javascript", "max_text_bytes",
                          "max_links", "session_idle_s", "guard"})
_GRACE_S = 10.0
# Chromium calls these by itself (component updates, sign-in) whatever the page does
_BROWSER_SERVICE_SUFFIXES = (".google.com", ".googleapis.com", ".gvt1.com", ".gstatic.com")


@dataclass(frozen=True, slots=True)
class BrowserOptions:
    """Validated ``browser`` plugin options.

    :param screenshot_dir: where PNGs are saved (default ``<state_dir>/browser/screenshots``).
    :param javascript: let pages run their own scripts (their requests are vetted all the same).
    :param guard: an object with ``decide(profile, op)`` (the engine's ``Guard``), used when a
        call's context brings no guard (``ExecContext.guard`` wins); without either, the
        profile's ``browser.use`` capabilities decide each request.
    """

    executable: str = "/usr/bin/chromium"
    screenshot_dir: Path | None = None
    javascript: bool = True
    max_text_bytes: int = 256 * 1024
    max_links: int = 1000
    session_idle_s: float = 300.0
    guard: DecidesOps | None = None

    @staticmethod
    def parse(raw: Mapping[str, Any] | None, state_dir: Path | None = None) -> BrowserOptions:
        opts = dict(raw or {})
        unknown = set(opts) - _OPTION_KEYS
        if unknown:
            raise ValueError(f"browser: unknown options {sorted(unknown)}")
        for key in ("max_text_bytes", "max_links"):
            val = opts.get(key, 1)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"browser: `{key}` must be a positive integer")
        if not isinstance(opts.get("javascript", True), bool):
            raise ValueError("browser: `javascript` must be a boolean")
        guard = opts.get("guard")
        if guard is not None and not callable(getattr(guard, "decide", None)):
            raise ValueError("browser: `guard` must have a `decide(profile, op)` method")
        shots = opts.get("screenshot_dir")
        if shots is None and state_dir is not None:
            shots = state_dir / "browser" / "screenshots"
        return BrowserOptions(
            executable=str(opts.get("executable", "/usr/bin/chromium")),
            screenshot_dir=Path(shots) if shots is not None else None,
            javascript=opts.get("javascript", True),
            max_text_bytes=opts.get("max_text_bytes", 256 * 1024),
            max_links=opts.get("max_links", 1000),
            session_idle_s=float(opts.get("session_idle_s", 300.0)),
            guard=guard,
        )


def _limit(ctx: ExecContext, name: str) -> int:
    """The call's effective limit ``name`` (``ctx.limits``: the permitting rule's included)."""
    value = getattr(ctx.limits, name)
    return int(value if value is not None else getattr(SYSTEM_DEFAULT_LIMITS, name))


def session_key(profile: Profile) -> str:
    """Sessions are per tenant, subject and tool: one agent's pages never meet another's."""
    return f"{profile.tenant}\x1f{profile.subject_id}\x1f{profile.tool_name}"


class BrowserExecutor:
    """Serves browser.nav and browser.screenshot on one shared headless Chromium."""

    name = "browser"
    capabilities = ExecutorCapabilities(
        op_kinds=frozenset({OpKind.BROWSER_NAV, OpKind.BROWSER_SCREENSHOT}),
        # every request is vetted on the host before it is fetched: what `restricted` asks
        network_modes=frozenset({NetworkMode.ON, NetworkMode.RESTRICTED}),
        resource_limits=True,
    )
    charges_at_start = True  # ctx.started() before the browser is asked for anything

    def __init__(self, options: BrowserOptions | None = None) -> None:
        self.options = options or BrowserOptions()
        self.rules = RequestRules(self.options.guard)
        # what Chromium dials by itself goes to this refusing proxy, reported to the op's gate
        self.sink = RefusingProxy(self._report_stray)
        self.host = BrowserHost(self.options.executable, self.options.session_idle_s,
                                proxy_server=self.sink.url)
        self._active: RequestGate | None = None

    def close(self) -> None:
        self.host.close()
        self.sink.close()

    def _report_stray(self, target: str, method: str) -> None:
        """A connection Chromium opened outside the gate (refused by the sink)."""
        gate = self._active
        host = target.split("://", 1)[-1].split("/", 1)[0].rpartition(":")[0] or target
        if gate is None or host.endswith(_BROWSER_SERVICE_SUFFIXES):
            return  # Chromium's own update and sign-in calls (refused too) are not the page's
        # the browser is shared: with other sessions open the source page is unknown, and
        # another tenant's target must not show up in this op's result
        shown = target if len(self.host.sessions) == 1 else "(a page of another session?)"
        gate.record(shown, "socket", f"`{method}` outside the request gate is refused")

    def end_session(self, profile: Profile) -> None:
        """Close the caller's session now (its context, cookies and page)."""
        key = session_key(profile)
        self.host.run(lambda h: h.drop_session(key), timeout_s=30)

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        if not isinstance(op, BrowserNavOp | BrowserScreenshotOp):
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED,
                                    f"the browser executor does not serve `{op.kind}`")
        profile = ctx.profile
        if isinstance(op, BrowserScreenshotOp):
            capture.check_bounds(op, _limit(ctx, "max_screenshot_width"),
                                 _limit(ctx, "max_screenshot_height"))
        if op.url is not None:
            # refuse early, before touching the browser
            self.rules.check(profile, op.url, ctx.guard,
                             screenshot=isinstance(op, BrowserScreenshotOp))
        remaining = ctx.deadline - time.monotonic()
        if remaining <= 0:
            raise PolicyEngineError(ErrorCode.TIMEOUT, "no time left for the browser operation")
        ctx.started()  # refusals above touched no browser
        try:
            out = self.host.run(lambda h: self._on_browser(h, ctx, op), remaining + _GRACE_S)
        except PolicyEngineError as err:
            if err.code is ErrorCode.TIMEOUT:
                ctx.cancel.cancel("browser operation exceeded its deadline")
            raise
        used = Usage(calls=1, bytes_in=int(out.pop("_bytes_in")))
        ctx.consume("bytes_in", used.bytes_in)
        ctx.record_side_effect(SideEffectRec(kind=SideEffect.BROWSER, meta={
            # redacted: the page URL's user info, query and fragment may carry tokens
            "op": op.kind, "url": redact_url(str(out.get("url") or "")),
            "requests": out.get("requests"),
            "blocked": len(out.get("blocked", ())),
        }))
        return ExecResult(ok=True, out=out, used=used)

    # --- on the browser thread ---------------------------------------------------------------

    def _on_browser(self, host: BrowserHost, ctx: ExecContext,
                    op: BrowserNavOp | BrowserScreenshotOp) -> dict[str, Any]:
        key = session_key(ctx.profile)
        try:
            sess = host.session(key, self._new_context)
            return self._run_op(sess, ctx, op)
        except PlaywrightError as exc:
            crashed = not host.alive()
            if crashed:
                host.kill_browser()  # relaunched by the next job
            else:
                host.drop_session(key)
            reason = "browser crashed" if crashed else "browser operation failed"
            raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, reason,
                                    audit={"error": str(exc)[:2000]}) from None

    def _new_context(self, browser: Browser, holder: dict[str, Any]) -> BrowserContext:
        context = browser.new_context(
            accept_downloads=False, service_workers="block",
            java_script_enabled=self.options.javascript, locale="en-US", timezone_id="UTC",
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

    def _run_op(self, sess: Session, ctx: ExecContext,
                op: BrowserNavOp | BrowserScreenshotOp) -> dict[str, Any]:
        profile = ctx.profile
        holder = sess.slot
        gate = RequestGate(
            page=sess.page, profile=profile, rules=self.rules,
            max_depth=_limit(ctx, "max_depth"), max_bytes_in=_limit(ctx, "max_bytes_in"),
            deadline=ctx.deadline, guard=ctx.guard,
            screenshot=isinstance(op, BrowserScreenshotOp),
        )
        holder["gate"] = self._active = gate
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
                    out.update(capture.extract_text(sess.page, self.options.max_text_bytes))
                elif op.extract == "links":
                    out.update(capture.extract_links(sess.page, self.options.max_links))
            else:
                out.update(self._screenshot(sess, ctx, op, gate))
        finally:
            lockdown.close_other_pages(sess.context, sess.page, gate)
            gate.active = False
            holder["gate"] = self._active = None
        out.update(requests=gate.requests, navigations=gate.navigations, hops=gate.hops,
                   blocked=list(gate.blocked), _bytes_in=gate.bytes_in)
        return out

    def _screenshot(self, sess: Session, ctx: ExecContext, op: BrowserScreenshotOp,
                    gate: RequestGate) -> dict[str, Any]:
        max_w = _limit(ctx, "max_screenshot_width")
        max_h = _limit(ctx, "max_screenshot_height")
        png, clipped = capture.screenshot(sess.page, op, max_w, max_h, gate.remaining_ms())
        width, height = capture.png_size(png)
        path = self._save(ctx.profile, png)
        return {"digest": Digest.of(png).model_dump(), "path": str(path) if path else None,
                "width": width, "height": height, "clipped": clipped,
                "png_b64": None if path else base64.b64encode(png).decode("ascii")}

    def _save(self, profile: Profile, png: bytes) -> Path | None:
        if self.options.screenshot_dir is None:
            return None
        self.options.screenshot_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", profile.call_id)[:80] or "call"
        path = self.options.screenshot_dir / f"{safe}-{secrets.token_hex(6)}.png"
        path.write_bytes(png)
        return path
