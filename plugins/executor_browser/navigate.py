"""Every request of a page is vetted and fetched here; redirects and navigations are counted.

The context routes ``**/*`` to :class:`RequestGate`. Each request is checked by the host rules
(guard), then fetched by Playwright with redirects *not* followed: a redirect of the main frame
is re-issued as a new navigation (so the next hop is vetted and counted again), a redirect of a
subresource is followed hop by hop here. Chromium's own network stack never dials anything (see
``host.CHROMIUM_ARGS``), so a request the gate does not serve does not happen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

from playwright.sync_api import APIResponse, Frame, Page, Request, Route
from playwright.sync_api import Error as PlaywrightError

from plugins.executor_browser.lockdown import abort_quietly
from plugins.executor_browser.rules import DecidesOps, RequestRules
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import Profile

_READ_METHODS = frozenset({"GET", "HEAD"})
_MAX_RECORDED = 100


@dataclass(slots=True)
class RequestGate:
    """Per-op request policy for one page; the route handler of the session's context.

    :param max_depth: navigations and redirect hops allowed after the first navigation.
    :param max_bytes_in: total response bytes this op may receive.
    :param guard: the call's guard (``ExecContext.guard``); ``None`` uses the rules' own.
    :param screenshot: requests are decided with the ``screenshot`` scope (a screenshot op).
    """

    page: Page
    profile: Profile
    rules: RequestRules
    max_depth: int
    max_bytes_in: int
    deadline: float
    guard: DecidesOps | None = None
    screenshot: bool = False
    active: bool = True
    navigations: int = 0
    hops: int = 0
    requests: int = 0
    bytes_in: int = 0
    blocked: list[dict[str, Any]] = field(default_factory=list)
    nav_error: PolicyEngineError | None = None
    pending_redirect: str | None = None
    download_seen: bool = False

    def remaining_ms(self) -> float:
        return max(1.0, (self.deadline - time.monotonic()) * 1000)

    def record(self, url: str, kind: str, reason: str) -> None:
        if len(self.blocked) < _MAX_RECORDED:
            self.blocked.append({"url": url[:2048], "kind": kind, "reason": reason})

    def refuse(self, route: Route, url: str, kind: str, err: PolicyEngineError,
               main: bool) -> None:
        self.record(url, kind, err.reason)
        if main and self.nav_error is None:
            self.nav_error = err
        route.abort("blockedbyclient")

    def check(self, url: str) -> None:
        """Vet ``url`` with the host rules and the call's guard."""
        self.rules.check(self.profile, url, self.guard, screenshot=self.screenshot)

    def on_download(self, download: Any) -> None:
        self.download_seen = True
        self.record(str(download.url), "download", "downloads are refused")

    def handle(self, route: Route, request: Request) -> None:
        """The ``**/*`` route handler; never raises (Playwright would print a traceback)."""
        try:
            self._handle(route, request)
        except PlaywrightError:
            # the page or context went away under the request (a popup closed, a crash)
            self.record(request.url, "request", "the request's page is gone")
            abort_quietly(route)

    def _handle(self, route: Route, request: Request) -> None:
        url = request.url
        if not self.active:  # a page-initiated request after the op ended
            route.abort("blockedbyclient")
            return
        if request.is_navigation_request():
            try:
                frame: Frame | None = request.frame
            except PlaywrightError:
                frame = None  # issued before its frame exists: a new window (window.open)
            if frame is None or frame.page is not self.page:
                self.requests += 1
                self.record(url, "popup", "popups are refused")
                route.abort("blockedbyclient")
                return
            main = frame.parent_frame is None
        else:
            main = False
        kind = "navigation" if main else "subresource"
        self.requests += 1
        if main:
            self.navigations += 1
            if self.navigations - 1 + self.hops > self.max_depth:
                err = PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    f"navigation depth limit {self.max_depth} reached",
                    audit={"url": url[:2048]})
                self.refuse(route, url, kind, err, main)
                return
        if request.method.upper() not in _READ_METHODS:
            err = PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"method `{request.method}` is refused: the browser is read-only")
            self.refuse(route, url, kind, err, main)
            return
        try:
            self.check(url)
        except PolicyEngineError as err:
            self.refuse(route, url, kind, err, main)
            return
        self._fetch(route, url, kind, main)

    def _fetch(self, route: Route, url: str, kind: str, main: bool) -> None:
        current = url
        while True:
            try:
                resp = route.fetch(url=current, max_redirects=0, timeout=self.remaining_ms())
            except PlaywrightError as exc:
                self.record(current, kind, "fetch failed")
                if main and self.nav_error is None:
                    self.nav_error = PolicyEngineError(
                        ErrorCode.PROVIDER_UNAVAILABLE, "the page could not be fetched",
                        audit={"url": current[:2048], "error": str(exc)[:1000]})
                route.abort("failed")
                return
            location = resp.headers.get("location")
            if not (300 <= resp.status < 400 and location):
                break
            target = urljoin(current, location)
            if main:  # re-issued by the navigation loop, vetted and counted as a navigation
                self.pending_redirect = target
                route.abort("aborted")
                return
            self.hops += 1
            try:
                if self.hops > self.max_depth:
                    raise PolicyEngineError(
                        ErrorCode.CAPABILITY_BLOCKED,
                        f"redirect limit {self.max_depth} reached")
                self.check(target)
            except PolicyEngineError as err:
                self.refuse(route, target, "redirect", err, main)
                return
            current = target
        self._deliver(route, resp, current, kind, main)

    def _deliver(self, route: Route, resp: APIResponse, url: str, kind: str, main: bool) -> None:
        if "attachment" in resp.headers.get("content-disposition", "").lower():
            err = PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "downloads are refused",
                                    audit={"url": url[:2048]})
            self.refuse(route, url, "download", err, main)
            return
        body = resp.body()
        self.bytes_in += len(body)
        if self.bytes_in > self.max_bytes_in:
            err = PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"responses exceed the {self.max_bytes_in}-byte limit",
                audit={"url": url[:2048], "bytes_in": self.bytes_in})
            self.refuse(route, url, kind, err, main)
            return
        route.fulfill(response=resp, body=body)


def navigate(gate: RequestGate, url: str) -> int | None:
    """Navigate the gate's page to ``url``, re-issuing main-frame redirects; return the status.

    :raises PolicyEngineError: the first refusal of a main-frame request, a download,
        ``LLM.TIMEOUT`` or ``PROVIDER.UNAVAILABLE``.
    """
    target = url
    while True:
        gate.pending_redirect = None
        try:
            resp = gate.page.goto(target, timeout=gate.remaining_ms(), wait_until="load")
        except PlaywrightError as exc:
            if gate.nav_error is not None:
                raise gate.nav_error from None
            if gate.pending_redirect is not None:
                target = gate.pending_redirect
                continue
            text = str(exc)
            if "Download is starting" in text or gate.download_seen:
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "downloads are refused",
                                        audit={"url": target[:2048]}) from None
            if "Timeout" in type(exc).__name__ or time.monotonic() >= gate.deadline:
                raise PolicyEngineError(ErrorCode.TIMEOUT, "page did not load in time",
                                        audit={"url": target[:2048]}) from None
            raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "navigation failed",
                                    audit={"url": target[:2048], "error": text[:1000]}) from None
        if gate.nav_error is not None:
            raise gate.nav_error
        if gate.download_seen:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "downloads are refused",
                                    audit={"url": target[:2048]})
        return resp.status if resp is not None else None
