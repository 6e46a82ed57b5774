"""The `browser` executor: read-only navigation, extraction and screenshots in headless Chromium.

One browser instance (``host.BrowserHost``) serves every session; each session has a fresh
context. Downloads are refused, nothing from an op is injected into a page, and every request is
vetted by the host rules (``rules.RequestRules``) before it is fetched.

Constructing the executor starts nothing and imports no Playwright: the rules, the refusing
sink and the browser host are made on first use (``pages`` holds the Playwright side), so an
engine that serves no browser op never pays for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.evidence import redact_url
from policy_engine.executor import ExecContext, ExecutorCapabilities
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    BrowserNavOp,
    BrowserScreenshotOp,
    ExecOp,
    ExecResult,
    NetworkMode,
    OpKind,
    Profile,
    SideEffect,
    SideEffectRec,
    Usage,
)

if TYPE_CHECKING:
    from plugins.executor_browser.host import BrowserHost
    from plugins.executor_browser.navigate import RequestGate
    from plugins.executor_browser.rules import DecidesOps, RequestRules
    from plugins.executor_browser.sink import RefusingProxy

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
        self._lock = threading.Lock()
        self._rules: RequestRules | None = None
        self._sink: RefusingProxy | None = None
        self._host: BrowserHost | None = None
        self._active: RequestGate | None = None

    @property
    def rules(self) -> RequestRules:
        """The host rules every request is vetted by (made on first use)."""
        with self._lock:
            if self._rules is None:
                from plugins.executor_browser.rules import RequestRules

                self._rules = RequestRules(self.options.guard)
            return self._rules

    @property
    def sink(self) -> RefusingProxy:
        """What Chromium dials by itself goes to this refusing proxy, reported to the op's
        gate (listening from first use)."""
        with self._lock:
            return self._sink_locked()

    def _sink_locked(self) -> RefusingProxy:
        if self._sink is None:
            from plugins.executor_browser.sink import RefusingProxy

            self._sink = RefusingProxy(self._report_stray)
        return self._sink

    @property
    def host(self) -> BrowserHost:
        """The shared browser (its thread and Chromium start with the first job)."""
        with self._lock:
            if self._host is None:
                from plugins.executor_browser.host import BrowserHost

                self._host = BrowserHost(self.options.executable, self.options.session_idle_s,
                                         proxy_server=self._sink_locked().url)
            return self._host

    def close(self) -> None:
        with self._lock:
            host, sink = self._host, self._sink
        if host is not None:
            host.close()
        if sink is not None:
            sink.close()

    def _report_stray(self, target: str, method: str) -> None:
        """A connection Chromium opened outside the gate (refused by the sink)."""
        gate = self._active
        host = target.split("://", 1)[-1].split("/", 1)[0].rpartition(":")[0] or target
        if gate is None or host.endswith(_BROWSER_SERVICE_SUFFIXES):
            return  # Chromium's own update and sign-in calls (refused too) are not the page's
        # the browser is shared: with other sessions open the source page is unknown, and
        # another tenant's target must not show up in this op's result
        browser = self._host
        alone = browser is not None and len(browser.sessions) == 1
        shown = target if alone else "(a page of another session?)"
        gate.record(shown, "socket", f"`{method}` outside the request gate is refused")

    def end_session(self, profile: Profile) -> None:
        """Close the caller's session now (its context, cookies and page)."""
        if self._host is None:
            return  # no browser yet: no session to close (and none to start for it)
        key = session_key(profile)
        self.host.run(lambda h: h.drop_session(key), timeout_s=30)

    def execute(self, ctx: ExecContext, op: ExecOp) -> ExecResult:
        from plugins.executor_browser import capture, pages  # Playwright: a browser op's cost

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
            out = self.host.run(lambda h: pages.on_browser(self, h, ctx, op),
                                remaining + _GRACE_S)
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
