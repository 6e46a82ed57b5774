"""The `browser` executor against real pages on loopback in a real headless Chromium."""

from __future__ import annotations

import http.server
import os
import signal
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_browser.executor import BrowserExecutor, BrowserOptions
from plugins.executor_browser.plugin import policy_engine_executors
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext, Executor
from policy_engine.model import (
    AllowLists,
    BrowserCapability,
    BrowserNavOp,
    BrowserScreenshotOp,
    Budget,
    CapabilityKind,
    DenyLists,
    Limits,
    Mappings,
    NetworkMode,
    Profile,
    ProfileCapability,
    SafetyClass,
    SideEffect,
)

pytestmark = pytest.mark.integration

PAGES: dict[str, tuple[int, dict[str, str], bytes]] = {}


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        host = self.headers.get("Host", "")
        type(self).hits.append(f"{host!s}{self.path}")
        status, headers, body = PAGES.get(self.path, (404, {}, b"not found"))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v.replace("{FORBIDDEN}", FORBIDDEN).replace("{ALLOWED}", ALLOWED))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(addr: str) -> http.server.ThreadingHTTPServer:
    srv = http.server.ThreadingHTTPServer((addr, 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


ALLOWED_SRV = _serve("127.0.0.1")
FORBIDDEN_SRV = _serve("127.0.0.2")
ALLOWED = f"http://127.0.0.1:{ALLOWED_SRV.server_address[1]}"
FORBIDDEN = f"http://127.0.0.2:{FORBIDDEN_SRV.server_address[1]}"
HTML = {"Content-Type": "text/html; charset=utf-8"}

PAGES.update({
    "/links": (200, HTML, b"<html><head><title>Links</title></head><body><h1>Index page</h1>"
               b"<a href='/a'>first</a> <a href='b.html'>second</a>"
               b" <a href='https://example.org/x'>out</a></body></html>"),
    "/a": (200, HTML, b"<html><body><p>page a</p></body></html>"),
    "/mixed": (200, HTML, b"<html><body><p>has a forbidden image</p>"
               + f"<img src='{FORBIDDEN}/pixel.png'><img src='/ok.png'>".encode()
               + b"</body></html>"),
    "/ok.png": (404, {}, b""),
    "/pixel.png": (200, {"Content-Type": "image/png"}, b"x"),
    "/evil": (200, HTML, b"<html><body>evil</body></html>"),
    "/redir-out": (302, {"Location": "{FORBIDDEN}/evil"}, b""),
    "/redir-in": (302, {"Location": "/hop2"}, b""),
    "/hop2": (302, {"Location": "/a"}, b""),
    "/download": (200, {"Content-Type": "application/octet-stream",
                        "Content-Disposition": "attachment; filename=x.bin"}, b"\0" * 64),
    "/dl-page": (200, HTML, b"<html><body><a href='/download' download>get it</a></body></html>"),
    "/draw": (200, HTML, b"<html><body style='margin:0;background:#fff'>"
              b"<div style='width:150px;height:90px;background:#d00'></div>"
              b"<h1 style='color:#00c'>Screenshot</h1></body></html>"),
    "/tall": (200, HTML, b"<html><body style='margin:0'>"
              b"<div style='height:3000px;background:linear-gradient(#f00,#00f)'></div>"
              b"</body></html>"),
    "/script": (200, HTML, b"<html><body><p id=p>scripted</p><script>"
                + f"fetch('{FORBIDDEN}/from-script').catch(() => 0);".encode()
                + b"</script></body></html>"),
})


def make_profile(hosts: tuple[str, ...] = ("127.0.0.1",), call_id: str = "c1",
                 **limits: Any) -> Profile:
    port = ALLOWED_SRV.server_address[1]
    cap = BrowserCapability(hosts=hosts, schemes=("http",), ports=(port,))
    return Profile(
        tenant="t", subject_id="agent:b", tool_name="browse", call_id=call_id,
        capabilities=(ProfileCapability(kind=CapabilityKind.BROWSER_USE, all_of=(cap,)),),
        safety=SafetyClass.LOW, side_effects=(SideEffect.BROWSER,), limits=Limits(**limits),
        budget=Budget(), allow=AllowLists(), deny=DenyLists(), mappings=Mappings(),
        network=NetworkMode.RESTRICTED, timeout_ms=60_000, consent_required=False, expires_at=0,
        policy_name="p", policy_version="1", policy_version_hash="h", manifest_version="1",
    )


def ctx_for(profile: Profile | None = None, seconds: float = 60) -> ExecContext:
    return ExecContext(profile=profile or make_profile(), deadline=time.monotonic() + seconds)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserExecutor]:
    shots = tmp_path_factory.mktemp("shots")
    ex = BrowserExecutor(BrowserOptions(screenshot_dir=shots))
    yield ex
    ex.close()


def _code(exc: pytest.ExceptionInfo[PolicyEngineError]) -> ErrorCode:
    return exc.value.code


def test_plugin_hook_builds_a_validated_executor(tmp_path: Path) -> None:
    [ex] = policy_engine_executors(EngineConfig(state_dir=tmp_path))
    assert isinstance(ex, Executor)
    assert ex.name == "browser"
    with pytest.raises(ValueError, match="unknown options"):
        policy_engine_executors(EngineConfig(options={"browser": {"nope": 1}}))


def test_nav_extracts_text_and_absolute_links(browser: BrowserExecutor) -> None:
    res = browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/links", extract="text"))
    assert res.ok
    assert res.out["status"] == 200
    assert res.out["title"] == "Links"
    assert "Index page" in res.out["text"]
    assert res.out["blocked"] == []
    res = browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/links", extract="links"))
    assert res.out["links"] == [f"{ALLOWED}/a", f"{ALLOWED}/b.html", "https://example.org/x"]
    assert res.used.bytes_in > 0


def test_forbidden_subresource_is_aborted_and_recorded(browser: BrowserExecutor) -> None:
    before = len(_Handler.hits)
    res = browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/mixed"))
    assert res.ok
    assert "forbidden image" in res.out["text"]
    blocked = [b for b in res.out["blocked"] if "127.0.0.2" in b["url"]]
    assert blocked
    assert blocked[0]["kind"] == "subresource"
    assert not any(h.startswith("127.0.0.2") for h in _Handler.hits[before:])


def test_script_requests_to_forbidden_hosts_are_aborted(browser: BrowserExecutor) -> None:
    before = len(_Handler.hits)
    res = browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/script"))
    assert res.ok
    time.sleep(0.5)
    assert not any(h.startswith("127.0.0.2") for h in _Handler.hits[before:])


def test_navigation_to_a_forbidden_host_is_refused(browser: BrowserExecutor) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        browser.execute(ctx_for(), BrowserNavOp(url=f"{FORBIDDEN}/evil"))
    assert _code(exc) is ErrorCode.CAPABILITY_BLOCKED


def test_redirect_to_a_forbidden_host_is_refused(browser: BrowserExecutor) -> None:
    before = len(_Handler.hits)
    with pytest.raises(PolicyEngineError) as exc:
        browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/redir-out"))
    assert _code(exc) is ErrorCode.CAPABILITY_BLOCKED
    assert not any(h.startswith("127.0.0.2") for h in _Handler.hits[before:])


def test_redirect_hops_count_against_the_depth_limit(browser: BrowserExecutor) -> None:
    res = browser.execute(ctx_for(make_profile(max_depth=2)),
                          BrowserNavOp(url=f"{ALLOWED}/redir-in"))
    assert res.out["url"] == f"{ALLOWED}/a"
    assert res.out["navigations"] == 3
    with pytest.raises(PolicyEngineError) as exc:
        browser.execute(ctx_for(make_profile(max_depth=1)),
                        BrowserNavOp(url=f"{ALLOWED}/redir-in"))
    assert _code(exc) is ErrorCode.CAPABILITY_BLOCKED
    assert "depth" in exc.value.reason


def test_downloads_are_refused(browser: BrowserExecutor) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/download"))
    assert _code(exc) is ErrorCode.CAPABILITY_BLOCKED
    assert "download" in exc.value.reason
    res = browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/dl-page", extract="links"))
    assert res.out["links"] == [f"{ALLOWED}/download"]


def _png_pixels(png: bytes) -> tuple[int, int, set[bytes]]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        kind, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", data[:10])
            assert depth == 8
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw = zlib.decompress(idat)
    bpp = {2: 3, 6: 4}[ctype]
    stride = width * bpp + 1
    # distinct raw scanline payloads are enough to tell a drawing from a blank page
    rows = {raw[i * stride + 1:(i + 1) * stride] for i in range(height)}
    return width, height, rows


def test_screenshot_is_a_real_png_with_bounded_dimensions(browser: BrowserExecutor) -> None:
    res = browser.execute(ctx_for(), BrowserScreenshotOp(url=f"{ALLOWED}/draw", width=400,
                                                         height=300))
    assert (res.out["width"], res.out["height"]) == (400, 300)
    png = Path(res.out["path"]).read_bytes()
    assert res.out["digest"]["size"] == len(png)
    width, height, rows = _png_pixels(png)
    assert (width, height) == (400, 300)
    assert len(rows) > 2, "screenshot looks blank"
    # the session keeps its page: a screenshot without url shoots the current page
    res = browser.execute(ctx_for(), BrowserScreenshotOp(width=200, height=100))
    assert (res.out["width"], res.out["height"]) == (200, 100)


def test_screenshot_limits(browser: BrowserExecutor) -> None:
    prof = make_profile(max_screenshot_width=300, max_screenshot_height=200)
    with pytest.raises(PolicyEngineError) as exc:
        browser.execute(ctx_for(prof), BrowserScreenshotOp(url=f"{ALLOWED}/draw", width=301,
                                                           height=100))
    assert _code(exc) is ErrorCode.CAPABILITY_BLOCKED
    res = browser.execute(ctx_for(prof), BrowserScreenshotOp(
        url=f"{ALLOWED}/tall", width=300, height=200, full_page=True))
    assert (res.out["width"], res.out["height"]) == (300, 200)
    assert res.out["clipped"] is True


def test_browser_crash_fails_the_op_and_relaunches(browser: BrowserExecutor) -> None:
    browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/a"))
    launches = browser.host.launches
    killed = _kill_own_chromium()
    assert killed, "no chromium browser process found below this test process"
    with pytest.raises(PolicyEngineError) as exc:
        browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/a"))
    assert _code(exc) is ErrorCode.EXECUTION_FAILED
    res = browser.execute(ctx_for(), BrowserNavOp(url=f"{ALLOWED}/a"))
    assert res.ok
    assert "page a" in res.out["text"]
    assert browser.host.launches == launches + 1


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _kill_own_chromium() -> list[int]:
    """SIGKILL the Chromium browser process this test process started (a descendant of it)."""
    me, killed = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if not cmd[0].endswith(b"chromium") or any(a.startswith(b"--type=") for a in cmd):
                continue
            anc = pid
            while anc > 1 and anc != me:
                anc = _parent(anc)
        except (OSError, IndexError, ValueError):
            continue
        if anc == me:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed
