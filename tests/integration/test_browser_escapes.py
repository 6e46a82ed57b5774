"""Page traffic the request gate does not route: WebRTC, worker sockets, popups (REPRO F3, F13).

Real pages on loopback, real headless Chromium, real listeners: a UDP port for STUN/TURN and a
TCP port no rule allows. Each listener must receive nothing; what the page tried is reported in
``out.blocked``; ``window.open`` is refused without a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plugins.executor_browser import lockdown
from plugins.executor_browser.executor import BrowserExecutor, BrowserOptions
from plugins.executor_browser.host import BrowserHost
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.model import BrowserCapability, BrowserNavOp, Profile
from tests.integration.servers import Handler, LoopbackServer, compiled_profile, send

pytestmark = pytest.mark.integration

HTML = "text/html; charset=utf-8"
SCOPES = ("open", "extract", "screenshot")
SETTLE_S = 2.0  # ICE gathering and STUN retransmits start within a few hundred ms


class Listener:
    """A UDP and a TCP listener on loopback ports no rule allows; records every contact."""

    def __init__(self) -> None:
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.udp_port = self.udp.getsockname()[1]
        self.tcp_port = self.tcp.getsockname()[1]
        self.contacts: list[str] = []
        for fn in (self._udp, self._tcp):
            threading.Thread(target=fn, daemon=True).start()

    def _udp(self) -> None:
        while True:
            try:
                data, peer = self.udp.recvfrom(4096)
            except OSError:
                return
            self.contacts.append(f"udp {peer} {data[:4].hex()}")

    def _tcp(self) -> None:
        while True:
            try:
                conn, peer = self.tcp.accept()
            except OSError:
                return
            self.contacts.append(f"tcp {peer}")
            conn.close()

    def close(self) -> None:
        self.udp.close()
        self.tcp.close()


def pages(lst: Listener, other: int) -> dict[str, bytes]:
    udp, tcp = lst.udp_port, lst.tcp_port
    ice = (f'[{{urls:"stun:127.0.0.1:{udp}"}},'
           f'{{urls:"turn:127.0.0.1:{udp}",username:"u",credential:"c"}},'
           f'{{urls:"turn:127.0.0.1:{tcp}?transport=tcp",username:"u",credential:"c"}}]')
    rtc = ("try{var pc=new RTCPeerConnection({iceServers:" + ice + "});"
           "pc.createDataChannel('x');pc.onicecandidate=function(e){if(e.candidate)"
           "{document.body.append(' CAND:'+e.candidate.candidate);}};"
           "pc.createOffer().then(o=>pc.setLocalDescription(o));"
           "document.body.append(' RTC-CREATED');}"
           "catch(e){document.body.append(' RTC-ERR '+e.name);}")
    worker = (f"new WebSocket('ws://127.0.0.1:{tcp}/from-worker');"
              f"fetch('http://127.0.0.1:{other}/worker-fetch').catch(e=>0);")
    sockets = (f"<html><body>sockets<script>"
               f"try{{new WebSocket('ws://127.0.0.1:{tcp}/from-page')}}catch(e){{}}"
               f"fetch('http://127.0.0.1:{other}/page-fetch').catch(e=>0);"
               f"new Worker(URL.createObjectURL(new Blob([{json.dumps(worker)}])));"
               f"</script><img src='/slow.png'></body></html>")  # load waits for the worker
    return {
        "/webrtc": f"<html><body>webrtc<script>{rtc}</script></body></html>".encode(),
        "/webtransport": (f"<html><body>wt<script>try{{new WebTransport("
                          f"'https://127.0.0.1:{udp}/x')}}catch(e){{document.body.append("
                          f"' WT-ERR '+e.name)}}</script></body></html>").encode(),
        "/sockets": sockets.encode(),
        "/open": (f"<html><body>opener<script>window.open('http://127.0.0.1:{other}/popup');"
                  f"window.open('/popup-self');</script></body></html>").encode(),
        "/popup-self": b"<html><body>popup</body></html>",
    }


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


@pytest.fixture(scope="module")
def other() -> Iterator[LoopbackServer]:
    """A web server on a port no rule allows."""
    with LoopbackServer({"/": lambda h: send(h, 200, HTML, b"other")}) as srv:
        yield srv


def _page(data: bytes) -> Callable[[Handler], None]:
    return lambda h: send(h, 200, HTML, data)


def _slow_image(h: Handler) -> None:
    time.sleep(1.5)  # the page's load event waits for it, so the op outlives the worker's dial
    send(h, 200, "image/png", b"png")


@pytest.fixture(scope="module")
def site(listener: Listener, other: LoopbackServer) -> Iterator[LoopbackServer]:
    body = pages(listener, other.port)
    routes = {path: _page(data) for path, data in body.items()}
    routes["/slow.png"] = _slow_image
    with LoopbackServer(routes) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserExecutor]:
    ex = BrowserExecutor(BrowserOptions())
    yield ex
    ex.close()


def policy_text(port: int) -> str:
    return (f'permit "pages" browser.use hosts ["127.0.0.1"] ports [{port}] schemes ["http"]\n'
            f'  scopes [open, extract, screenshot]\n')


def guarded(tmp: Path, port: int, tool: str) -> tuple[Profile, Guard]:
    cap = BrowserCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,),
                            scopes=SCOPES)
    return compiled_profile(tmp, policy_text(port), (cap,), tool=tool)


def nav(browser: BrowserExecutor, tmp: Path, site: LoopbackServer, path: str,
        tool: str = "browse") -> dict[str, object]:
    profile, guard = guarded(tmp, site.port, tool)
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60, guard=guard)
    res = browser.execute(ctx, BrowserNavOp(url=site.url(path), extract="text"))
    assert res.ok
    return res.out


def kinds(out: dict[str, object]) -> set[str]:
    blocked = out["blocked"]
    assert isinstance(blocked, list)
    return {str(b["kind"]) for b in blocked}


def test_webrtc_reaches_no_udp_or_tcp_port(browser: BrowserExecutor, tmp_path: Path,
                                           site: LoopbackServer, listener: Listener) -> None:
    before = len(listener.contacts)
    out = nav(browser, tmp_path, site, "/webrtc")
    time.sleep(SETTLE_S)
    assert "RTC-ERR TypeError" in str(out["text"])  # the API is gone before page scripts run
    assert listener.contacts[before:] == []


def test_chromium_keeps_webrtc_off_udp_without_the_init_script(
    browser: BrowserExecutor, tmp_path: Path, site: LoopbackServer, listener: Listener,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second layer alone: the launch flags hold WebRTC to the (refusing) proxy."""
    monkeypatch.setattr(lockdown, "INIT_SCRIPT", "/* layer under test: flags only */")
    before = len(listener.contacts)
    out = nav(browser, tmp_path, site, "/webrtc", tool="browse-flags-only")  # a new context
    time.sleep(SETTLE_S)
    text = str(out["text"])
    assert "RTC-CREATED" in text
    assert "typ host" not in text  # no host candidates: nothing to announce over mDNS
    assert "typ srflx" not in text
    assert listener.contacts[before:] == []


def test_webtransport_is_removed(browser: BrowserExecutor, tmp_path: Path,
                                 site: LoopbackServer, listener: Listener) -> None:
    before = len(listener.contacts)
    out = nav(browser, tmp_path, site, "/webtransport")
    time.sleep(0.5)
    assert "WT-ERR TypeError" in str(out["text"])
    assert listener.contacts[before:] == []


def _drop_all_sessions(host: BrowserHost) -> None:
    for key in list(host.sessions):
        host.drop_session(key)


def test_sockets_and_fetches_to_other_ports_are_blocked_and_reported(
    browser: BrowserExecutor, tmp_path: Path, site: LoopbackServer, listener: Listener,
    other: LoopbackServer,
) -> None:
    before, seen_before = len(listener.contacts), len(other.seen.requests)
    profile, guard = guarded(tmp_path, site.port, "browse-sockets")
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60, guard=guard)
    # alone in the browser, a stray connection is attributed to this op with its target
    browser.host.run(_drop_all_sessions, timeout_s=30)
    refused = browser.sink.refused
    res = browser.execute(ctx, BrowserNavOp(url=site.url("/sockets"), extract="text"))
    assert browser.sink.refused > refused
    assert listener.contacts[before:] == []
    assert other.seen.requests[seen_before:] == []
    urls = {str(b["url"]): str(b["kind"]) for b in res.out["blocked"]}
    assert urls[f"ws://127.0.0.1:{listener.tcp_port}/from-page"] == "websocket"
    assert urls[f"http://127.0.0.1:{other.port}/page-fetch"] == "subresource"
    # the worker's WebSocket is not routed by Playwright: it met the refusing proxy instead
    assert urls[f"127.0.0.1:{listener.tcp_port}"] == "socket"


def _pages_per_session(host: BrowserHost) -> list[int]:
    counts = []
    for sess in host.sessions.values():
        sess.page.wait_for_timeout(300)  # let late popup events be dispatched first
        counts.append(len(sess.context.pages))
    return counts


def test_window_open_is_refused_cleanly(browser: BrowserExecutor, tmp_path: Path,
                                        site: LoopbackServer, other: LoopbackServer,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    seen_before = len(other.seen.requests)
    site_before = [p for _m, p, _h in site.seen.requests]
    out = nav(browser, tmp_path, site, "/open", tool="browse-open")
    time.sleep(0.5)
    assert "opener" in str(out["text"])
    assert "popup" in kinds(out)
    assert other.seen.requests[seen_before:] == []
    assert "/popup-self" not in [p for _m, p, _h in site.seen.requests][len(site_before):]
    # the session still has exactly its own page, and Playwright printed nothing
    assert len(browser.host.sessions) >= 1
    pages_open = browser.host.run(_pages_per_session, timeout_s=30)
    assert all(n == 1 for n in pages_open), pages_open
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "Error occurred in event listener" not in err


def _cli(tmp: Path, site: LoopbackServer, path: str) -> subprocess.CompletedProcess[str]:
    (tmp / "browser.sbpolicy").write_text(
        'policy "redteam/browser" version "1.0.0"\n'
        'defaults {\n  timeout 20s\n  network on\n}\n' + policy_text(site.port))
    cap = {"kind": "browser.use", "hosts": ["127.0.0.1"], "ports": [site.port],
           "schemes": ["http"], "scopes": list(SCOPES)}
    (tmp / "grant.json").write_text(json.dumps({
        "tenant": "red", "subject_id": "agent:rt-b", "tool_name": "rtb", "call_id": "c-1",
        "capabilities": [cap], "expires_at": 4102444800000}))
    (tmp / "manifest.json").write_text(json.dumps({
        "name": "rtb", "version": "1.0.0", "description": "browser", "permissions": [cap],
        "side_effects": ["Browser", "Read"], "safety_class": "Low", "network": "on"}))
    (tmp / "req.json").write_text(json.dumps({
        "op": {"kind": "browser.nav", "url": site.url(path), "extract": "text"},
        "manifest": "manifest.json", "grant": "grant.json"}))
    return subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--policy",
         str(tmp / "browser.sbpolicy"), "--request", str(tmp / "req.json"), "--state-dir",
         str(tmp / "state"), "--format", "json"],
        capture_output=True, text=True, timeout=120, env={**os.environ}, check=False)


def test_cli_webrtc_and_window_open(tmp_path: Path, site: LoopbackServer,
                                    listener: Listener, other: LoopbackServer) -> None:
    """REPRO F3 and F13 as the red team ran them: through the CLI, a shipped-style policy."""
    before, seen_before = len(listener.contacts), len(other.seen.requests)
    run = _cli(tmp_path, site, "/webrtc")
    time.sleep(SETTLE_S)
    assert run.returncode == 0, run.stderr
    assert "RTC-ERR" in run.stdout
    assert listener.contacts[before:] == []
    run = _cli(tmp_path, site, "/open")
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert "popups are refused" in run.stdout
    assert other.seen.requests[seen_before:] == []
