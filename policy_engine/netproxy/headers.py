"""Request headers and shown URLs shared by the ``net.http`` executor and the restricted proxy."""

from __future__ import annotations

import re

from policy_engine.errors import ErrorCode, PolicyEngineError

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})
"""Request headers never forwarded (RFC 9110 §7.6.1), besides those ``Connection`` names."""

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Only visible ASCII, space and tab: a control character could split the header, and anything
# non-ASCII (U+0085, U+2028, U+00FF) is encoded differently by each client, or not at all
_BAD_VALUE = re.compile(r"[^\x09\x20-\x7e]")

MANAGED = frozenset({"content-length", "accept-encoding"})
"""Request headers the executor sets itself: the length it sends, ``identity`` encoding."""


def clean_request_headers(headers: dict[str, str]) -> list[tuple[str, str]]:
    """Drop hop-by-hop and executor-managed headers; refuse a ``Host`` override.

    :raises PolicyEngineError: ``SANDBOX.CAPABILITY_BLOCKED`` when ``Host`` is set.
    """
    named = {
        t.strip().lower()
        for k, v in headers.items() if k.lower() == "connection" for t in v.split(",")
    }
    out: list[tuple[str, str]] = []
    for key, value in headers.items():
        if _TOKEN.fullmatch(key) is None or _BAD_VALUE.search(value) is not None:
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    "invalid request header name or value")
        low = key.strip().lower()
        if low == "host":
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED,
                                    "request header `Host` may not be set")
        if low in HOP_BY_HOP or low in MANAGED or low in named:
            continue
        out.append((key.strip(), value))
    out.append(("Accept-Encoding", "identity"))
    return out


def redacted_url(scheme: str, host: str, port: int, path: str) -> str:
    """``scheme://host:port/path``: what evidence and messages show (no query, no userinfo)."""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}{path or '/'}"
