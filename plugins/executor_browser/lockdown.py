"""What keeps page traffic inside the request gate beyond routing: WebRTC, QUIC and popups.

Routing (``navigate.RequestGate``) sees HTTP requests only. WebRTC (STUN/TURN over UDP) and
WebTransport (QUIC) open their own sockets, so they are shut twice: Chromium is launched with
``WEBRTC_ARGS`` (WebRTC may use proxied connections only, and the proxy is the refusing sink;
``host.CHROMIUM_ARGS`` turns QUIC off) and every frame runs ``INIT_SCRIPT`` before its own
scripts, which removes the APIs.
Popups (``window.open``) are closed as they open; their navigation is refused by the gate.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from playwright.sync_api import BrowserContext, Page, Route
from playwright.sync_api import Error as PlaywrightError

# `webrtc-ip-handling-policy` is the command-line form of the WebRtcIPHandling policy (current
# Chromium); `force-webrtc-ip-handling-policy` is its older name, ignored where unknown.
WEBRTC_ARGS: tuple[str, ...] = (
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)

# Constant (nothing from an op is ever injected); runs in every frame before page scripts.
INIT_SCRIPT = """(() => {
  for (const name of ["RTCPeerConnection", "webkitRTCPeerConnection", "RTCDataChannel",
      "RTCIceCandidate", "RTCIceTransport", "RTCSessionDescription", "RTCRtpSender",
      "RTCRtpReceiver", "RTCRtpTransceiver", "RTCDtlsTransport", "RTCSctpTransport",
      "RTCEncodedAudioFrame", "RTCEncodedVideoFrame", "WebTransport"]) {
    try { delete globalThis[name]; } catch (e) {}
    try { Object.defineProperty(globalThis, name, {value: undefined, configurable: false}); }
    catch (e) {}
  }
})();"""


class Records(Protocol):
    def record(self, url: str, kind: str, reason: str) -> None: ...


def abort_quietly(route: Route) -> None:
    """Abort a request; a page or context that closed meanwhile is not an error."""
    with contextlib.suppress(PlaywrightError):
        route.abort("blockedbyclient")


def close_popup(popup: Page, gate: Records | None) -> None:
    """Close a window a page opened (popups are refused) and report it to the op's gate."""
    if gate is not None:
        gate.record(popup.url or "about:blank", "popup", "popups are refused")
    with contextlib.suppress(PlaywrightError):
        popup.close()


def close_other_pages(context: BrowserContext, keep: Page, gate: Records | None) -> None:
    """Close every window of the session but its own page (a popup whose event came late)."""
    for page in context.pages:
        if page is not keep:
            close_popup(page, gate)
