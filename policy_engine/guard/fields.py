"""Shape checks of the op fields an executor acts on besides the resource: HTTP method and
headers, a screenshot's selector.

Refused here, before any budget is charged, so ``explain`` answers as the run does; the
executors keep their own checks as a second line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.paths import quote

TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""RFC 9110 §5.6.2 token: a header name or a method."""
_FIELD_VALUE_BAD = re.compile(r"[^\t\x20-\x7e]")
"""Anything but HTAB, SP and visible ASCII (RFC 9110 §5.5; obs-text is refused, see below)."""

HOP_BY_HOP: frozenset[str] = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "proxy-authentication-info", "te", "trailer", "transfer-encoding", "upgrade",
})
"""Connection-specific headers (RFC 9110 §7.6.1): the executor's connection owns them."""
REFUSED_HEADERS: frozenset[str] = HOP_BY_HOP | {"host", "content-length"}
"""Never set by a call: ``Host`` would aim the request elsewhere than the URL the policy
checked; the length is the executor's, from the body it sends."""

MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024
MAX_SELECTOR = 1024


def check_method(raw: object) -> str:
    """The method upper-cased, after checking it is a token (ASCII, no space or control)."""
    if not isinstance(raw, str) or not raw.isascii() or TOKEN.fullmatch(raw) is None \
            or len(raw) > 16:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                f"invalid http method {quote(str(raw)[:40])}")
    method = raw.upper()
    if type(raw) is str:
        if len(GOOD_METHODS) >= _GOOD_METHODS_SIZE:  # a bound, not an LRU: a miss re-checks one
            GOOD_METHODS.clear()
        GOOD_METHODS[raw] = method
    return method


GOOD_METHODS: dict[str, str] = {}
"""Methods (exact ``str`` keys) that passed :func:`check_method`, upper-cased: a call's method
is one of a handful, and the guard looks it up here before checking it (``resolve``). A ``str``
subclass is never stored (it could compare equal to a method it does not spell)."""
_GOOD_METHODS_SIZE = 64


def header_refusal(headers: Mapping[str, str]) -> tuple[ErrorCode, str] | None:
    """The code and reason refusing ``headers``, or ``None`` when they may be sent as given."""
    if len(headers) > MAX_HEADERS:
        return (ErrorCode.SCHEMA_VALIDATION_FAILED,
                f"{len(headers)} request headers; at most {MAX_HEADERS}")
    total = 0
    for name, value in headers.items():
        if not isinstance(name, str) or TOKEN.fullmatch(name) is None:
            return (ErrorCode.SCHEMA_VALIDATION_FAILED,
                    f"request header name {repr(name)[:60]} is not a token (RFC 9110)")
        if not isinstance(value, str):
            return ErrorCode.SCHEMA_VALIDATION_FAILED, f"request header `{name}` is not a string"
        bad = _FIELD_VALUE_BAD.search(value)
        if bad is not None:
            ch = bad.group()
            what = ("CR/LF" if ch in "\r\n" else "NUL" if ch == "\x00"
                    else "a control character" if ord(ch) < 0x80 else "a non-ASCII character")
            return (ErrorCode.SCHEMA_VALIDATION_FAILED,
                    f"request header `{name}` has {what} in its value")
        low = name.lower()
        if low in REFUSED_HEADERS:
            why = ("it would aim the request at another host than the URL"
                   if low == "host" else "the executor sets it from the body it sends"
                   if low == "content-length" else "it is hop-by-hop (RFC 9110 §7.6.1)")
            return ErrorCode.CAPABILITY_BLOCKED, f"request header `{name}` may not be set: {why}"
        total += len(name) + len(value) + 4
    if total > MAX_HEADER_BYTES:
        return (ErrorCode.SCHEMA_VALIDATION_FAILED,
                f"request headers are {total} bytes; at most {MAX_HEADER_BYTES}")
    return None


def check_headers(headers: object) -> None:
    """Raise the refusal of :func:`header_refusal`."""
    if not isinstance(headers, Mapping):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, "headers must be an object")
    found = header_refusal(headers)
    if found is not None:
        raise PolicyEngineError(*found)


def check_selector(selector: object) -> None:
    """A screenshot selector: a bounded, printable string, no Playwright-internal engine."""
    if selector is None:
        return
    if not isinstance(selector, str) or not selector or len(selector) > MAX_SELECTOR \
            or not selector.isprintable():
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "selector must be a printable string of at most "
                                f"{MAX_SELECTOR} characters")
    if selector.lstrip().lower().startswith(("internal:", "_react=", "_vue=")):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "selector uses an internal selector engine")
