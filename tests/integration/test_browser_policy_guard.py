"""The browser under a real compiled policy: every subrequest is decided by the call's guard.

The rule's condition admits only paths under ``/ok``; a page there that loads ``/nope/...``
must have that subresource aborted before the server sees it, and a subresource redirect into
``/nope`` must stop at the hop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_browser.executor import BrowserExecutor, BrowserOptions
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.model import BrowserCapability, BrowserNavOp, BrowserScreenshotOp, Profile
from tests.integration.servers import LoopbackServer, compiled_profile, redirect, send

pytestmark = pytest.mark.integration

HTML = "text/html; charset=utf-8"
PAGE = (b"<html><head><title>OK page</title></head><body><p>policy page</p>"
        b"<img src='/ok/img.png'><img src='/nope/img.png'><img src='/ok/jump.png'>"
        b"</body></html>")
ROUTES = {
    "/ok/page": lambda h: send(h, 200, HTML, PAGE),
    "/ok/img.png": lambda h: send(h, 200, "image/png", b"png"),
    "/ok/jump.png": redirect("/nope/hop.png"),
    "/nope/img.png": lambda h: send(h, 200, "image/png", b"png"),
    "/nope/hop.png": lambda h: send(h, 200, "image/png", b"png"),
    "/nope/page": lambda h: send(h, 200, HTML, b"<html><body>nope</body></html>"),
}
SCOPES = ("open", "extract", "screenshot")


@pytest.fixture(scope="module")
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserExecutor]:
    ex = BrowserExecutor(BrowserOptions())
    yield ex
    ex.close()


def policy(tmp: Path, port: int, hosts: str = '["127.0.0.1"]') -> tuple[Profile, Guard]:
    rules = (f'permit "ok-paths" browser.use hosts {hosts} schemes ["http"] ports [{port}]\n'
             f'  scopes [open, extract, screenshot] when `request.path.startsWith("/ok")`')
    cap = BrowserCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,),
                            scopes=SCOPES)  # type: ignore[arg-type]  # pydantic coerces str
    return compiled_profile(tmp, rules, (cap,), tool="browse")


def ctx_for(profile: Profile, guard: Guard | None) -> ExecContext:
    return ExecContext(profile=profile, deadline=time.monotonic() + 60, guard=guard)


def seen(server: LoopbackServer) -> list[str]:
    return [p for _m, p, _h in server.seen.requests]


def test_subresources_the_condition_refuses_are_aborted(
    tmp_path: Path, server: LoopbackServer, browser: BrowserExecutor
) -> None:
    profile, guard = policy(tmp_path, server.port)
    before = len(server.seen.requests)
    res = browser.execute(ctx_for(profile, guard), BrowserNavOp(url=server.url("/ok/page")))
    assert res.out["status"] == 200
    assert "policy page" in res.out["text"]
    kinds = {b["url"].split(str(server.port), 1)[1]: b["kind"] for b in res.out["blocked"]}
    assert kinds == {"/nope/img.png": "subresource", "/nope/hop.png": "redirect"}
    got = seen(server)[before:]
    assert "/ok/img.png" in got
    assert "/ok/jump.png" in got
    assert not any(p.startswith("/nope") for p in seen(server))


def test_navigation_and_screenshot_outside_the_condition_are_refused(
    tmp_path: Path, server: LoopbackServer, browser: BrowserExecutor
) -> None:
    profile, guard = policy(tmp_path, server.port)
    for op in (BrowserNavOp(url=server.url("/nope/page")),
               BrowserScreenshotOp(url=server.url("/nope/page"))):
        with pytest.raises(PolicyEngineError) as info:
            browser.execute(ctx_for(profile, guard), op)
        assert info.value.code is ErrorCode.CAPABILITY_BLOCKED
    shot = browser.execute(ctx_for(profile, guard), BrowserScreenshotOp(url=server.url("/ok/page")))
    assert shot.out["width"] > 0
    assert not any(p.startswith("/nope") for p in seen(server))


def test_without_the_policy_guard_the_condition_cannot_allow(
    tmp_path: Path, server: LoopbackServer
) -> None:
    profile, _guard = policy(tmp_path, server.port)
    ex = BrowserExecutor(BrowserOptions(guard=Guard()))  # no policy set: fails closed
    try:
        with pytest.raises(PolicyEngineError) as info:
            ex.execute(ctx_for(profile, None), BrowserNavOp(url=server.url("/ok/page")))
        assert info.value.code is ErrorCode.CAPABILITY_BLOCKED
    finally:
        ex.close()


def test_loopback_needs_a_policy_rule_naming_it(
    tmp_path: Path, server: LoopbackServer, browser: BrowserExecutor
) -> None:
    profile, guard = policy(tmp_path, server.port, hosts='["*"]')
    before = len(server.seen.requests)
    with pytest.raises(PolicyEngineError) as info:
        browser.execute(ctx_for(profile, guard), BrowserNavOp(url=server.url("/ok/page")))
    assert info.value.code is ErrorCode.CAPABILITY_BLOCKED
    assert len(server.seen.requests) == before
