"""Redirect hops: which statuses redirect, how the method and body change, where the next hop is."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

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
    new_url = httpx.URL(url).join(location.strip())
    new_method = method
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        new_method = "GET"
    keep_body = new_method == method
    new_body = body if keep_body else b""
    old = httpx.URL(url)
    same_origin = (old.scheme, old.host, old.port) == (new_url.scheme, new_url.host, new_url.port)
    new_headers = [
        (k, v) for k, v in headers
        if (keep_body or k.lower() not in ("content-type", "content-encoding"))
        and (same_origin or k.lower() not in CREDENTIAL_HEADERS)
    ]
    return NextHop(method=new_method, url=str(new_url.copy_with(fragment=None)), body=new_body,
                   headers=new_headers)
