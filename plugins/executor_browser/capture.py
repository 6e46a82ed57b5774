"""Read-only outputs of a loaded page: text, links and bounded PNG screenshots.

Only constant scripts written here ever run in the page (to list links and measure the page);
nothing from an op is evaluated or injected.
"""

from __future__ import annotations

import struct
from typing import Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import BrowserScreenshotOp, Digest

_LINKS_JS = "els => els.map(e => e.href).filter(h => typeof h === 'string' && h.length > 0)"
_HEIGHT_JS = "() => Math.max(document.documentElement.scrollHeight, document.body ? " \
             "document.body.scrollHeight : 0)"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def extract_text(page: Page, max_bytes: int) -> dict[str, Any]:
    """The page's visible text, cut to ``max_bytes`` UTF-8 bytes, with a digest of all of it."""
    body = page.locator("body")
    text = body.inner_text() if body.count() else ""
    data = text.encode("utf-8")
    cut = data[:max_bytes].decode("utf-8", errors="ignore")
    return {"text": cut, "text_truncated": len(data) > max_bytes,
            "text_digest": Digest.of(data).model_dump()}


def extract_links(page: Page, max_links: int) -> dict[str, Any]:
    """Absolute link targets (``a[href]``) in document order, deduplicated."""
    hrefs: list[str] = page.locator("a[href]").evaluate_all(_LINKS_JS)
    seen: dict[str, None] = {}
    for h in hrefs:
        seen.setdefault(str(h), None)
    links = list(seen)
    return {"links": links[:max_links], "links_truncated": len(links) > max_links}


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "screenshot is not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def check_bounds(op: BrowserScreenshotOp, max_w: int, max_h: int) -> None:
    """Refuse a viewport larger than the profile's screenshot limits (never silently shrunk)."""
    if op.width > max_w or op.height > max_h:
        raise PolicyEngineError(
            ErrorCode.CAPABILITY_BLOCKED,
            f"screenshot {op.width}x{op.height} exceeds the {max_w}x{max_h} limit",
            audit={"width": op.width, "height": op.height, "max": [max_w, max_h]},
        )


def screenshot(page: Page, op: BrowserScreenshotOp, max_w: int, max_h: int,
               timeout_ms: float) -> tuple[bytes, bool]:
    """Take the PNG; a full page or element taller or wider than the limits is clipped.

    :return: the PNG bytes and whether it was clipped to the limits.
    """
    page.set_viewport_size({"width": op.width, "height": op.height})
    try:
        if op.selector is not None:
            box = page.locator(op.selector).first.bounding_box(timeout=timeout_ms)
            if box is None:
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                        "the selected element is not visible")
            w, h = min(box["width"], max_w), min(box["height"], max_h)
            clipped = (w, h) != (box["width"], box["height"])
            clip = {"x": box["x"], "y": box["y"], "width": max(w, 1), "height": max(h, 1)}
            return page.screenshot(clip=clip, full_page=True, timeout=timeout_ms,  # type: ignore[arg-type]  # FloatRect is a TypedDict
                                   type="png", animations="disabled"), clipped
        if op.full_page:
            height = int(page.evaluate(_HEIGHT_JS))
            if height > max_h:
                clip = {"x": 0, "y": 0, "width": op.width, "height": max_h}
                return page.screenshot(clip=clip, full_page=True, timeout=timeout_ms,  # type: ignore[arg-type]  # FloatRect is a TypedDict
                                       type="png", animations="disabled"), True
            return page.screenshot(full_page=True, timeout=timeout_ms, type="png",
                                   animations="disabled"), False
        return page.screenshot(timeout=timeout_ms, type="png", animations="disabled"), False
    except PlaywrightError as exc:
        raise PolicyEngineError(ErrorCode.EXECUTION_FAILED, "screenshot failed",
                                audit={"error": str(exc)[:1000]}) from None
