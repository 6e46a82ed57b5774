"""Redirect hops: which statuses redirect, how the method and body change, where the next hop is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urljoin

from policy_engine.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
else:  # the first redirect imports it (the executor's first request already has)
    httpx = lazy_module("httpx")

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
"""Dropped when a redirect leaves the origin, as browsers and httpx do."""


@dataclass(frozen=True, slots=True)
class NextHop:
    """The request a redirect asks for."""

    method: str
    url: str
    body: bytes
    headers: list[tuple[str, str]]


def next_hop(
    status: int, location: str | None, method: str, url: str, body: bytes,
    headers: list[tuple[str, str]],
) -> NextHop | None:
    """The hop a ``status``/``Location`` pair asks for, or ``None`` when it is not a redirect.

    Method rules (RFC 9110 §15.4, as browsers apply them): 303 turns anything but HEAD into GET;
    301 and 302 turn POST into GET; 307 and 308 keep method and body. A body that is dropped takes
    its ``Content-Type`` with it; credentials are dropped when the origin changes.

    :param url: the URL of the request that got this answer (absolute).
    """
    if status not in REDIRECT_STATUSES or not location:
        return None
    old = httpx.URL(url)
    try:
        joined = old.join(location.strip())
    except (httpx.InvalidURL, ValueError):
        # httpx cannot read it (`http://%5B::1%5D/`, `http://[::1/`): the text still goes to the
        # guard, which refuses it with its own code, as it would refuse it as a first request
        joined = None
    new_method = method
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        new_method = "GET"
    keep_body = new_method == method
    new_body = body if keep_body else b""
    same_origin = joined is not None and \
        (old.scheme, old.host, old.port) == (joined.scheme, joined.host, joined.port)
    new_headers = [
        (k, v) for k, v in headers
        if (keep_body or k.lower() not in ("content-type", "content-encoding"))
        and (same_origin or k.lower() not in CREDENTIAL_HEADERS)
    ]
    new_url = (str(joined.copy_with(fragment=None)) if joined is not None
               else _join_text(url, location.strip()))
    return NextHop(method=new_method, url=new_url, body=new_body, headers=new_headers)


def _join_text(base: str, location: str) -> str:
    """``location`` against ``base`` as plain text, for the guard to judge (it refuses what is
    malformed with its own code); urllib refuses some texts too (`[` left open)."""
    try:
        return urljoin(base, location).split("#", 1)[0]
    except ValueError:
        return location.split("#", 1)[0]
