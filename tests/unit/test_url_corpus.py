"""Differential test of ``parse_url`` on the WHATWG URL corpus against httpx and the standard.

For every test object with an ``input`` (read as UTF-8, invisible code points kept), either
``parse_url`` refuses it, or the (scheme, host, port) it vets equals

* what httpx would dial: ``httpx.URL(input)``'s scheme, host and port, where a numeric host is
  read the way the socket layer reads it (``inet_aton``, as glibc ``getaddrinfo`` does), and
  one trailing dot of a name is dropped (the same DNS name); when httpx refuses the input it
  dials nothing, so only the next bullet applies;
* what a WHATWG client (the browser executor's Chromium) would dial: the object's
  ``protocol``, ``hostname`` and ``port``; an input the standard marks as ``failure`` must be
  refused.

``parse_url`` takes absolute URLs only, with no base resolution: a relative input (most objects
carry a ``base``) is refused, which is the safe answer for a guard that never sees a base.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from policy_engine.errors import PolicyEngineError
from policy_engine.guard.urls import DEFAULT_PORTS, parse_url

CORPUS = Path(__file__).resolve().parents[1] / "data" / "urltestdata.json"
Origin = tuple[str, str, int]


def _cases() -> list[dict[str, Any]]:
    data = json.loads(CORPUS.read_text(encoding="utf-8"))
    return [c for c in data if isinstance(c, dict) and "input" in c]


def httpx_dials(raw: str) -> Origin | None:
    """The origin httpx would connect to for ``raw``, or ``None`` if it refuses the URL."""
    try:
        u = httpx.URL(raw)
    except Exception:  # noqa: BLE001 — any refusal by httpx means nothing is dialed
        return None
    if not u.scheme or not u.raw_host:
        return None
    host = u.raw_host.decode("ascii")
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        try:
            host = str(ipaddress.IPv4Address(socket.inet_aton(host)))
        except OSError:
            host = host[:-1] if host.endswith(".") else host
    port = u.port if u.port is not None else DEFAULT_PORTS.get(u.scheme, -1)
    return (u.scheme, host, port)


def whatwg_dials(case: dict[str, Any]) -> Origin | None:
    """The origin the WHATWG expectation names, or ``None`` for ``failure``."""
    if case.get("failure"):
        return None
    scheme = case["protocol"].rstrip(":")
    host = case["hostname"].strip("[]")
    host = host[:-1] if host.endswith(".") else host
    port = int(case["port"]) if case["port"] else DEFAULT_PORTS.get(scheme, -1)
    return (scheme, host, port)


def run_corpus(schemes: tuple[str, ...]) -> dict[str, Any]:
    counts = {"cases": 0, "refused": 0, "agreed": 0, "httpx_refused_whatwg_agreed": 0}
    disagreements: list[tuple[str, Origin, Origin | None, Origin | None]] = []
    for case in _cases():
        counts["cases"] += 1
        raw = case["input"]
        try:
            u = parse_url(raw, schemes=schemes)
        except PolicyEngineError:
            counts["refused"] += 1
            continue
        vetted = (u.scheme, u.host, u.port)
        hx, wg = httpx_dials(raw), whatwg_dials(case)
        if wg != vetted or (hx is not None and hx != vetted):
            disagreements.append((raw, vetted, hx, wg))
        elif hx is None:
            counts["httpx_refused_whatwg_agreed"] += 1
        else:
            counts["agreed"] += 1
    return {**counts, "disagreements": disagreements}


@pytest.mark.parametrize("schemes", [("http", "https"), ("http", "https", "ws", "wss", "ftp")])
def test_never_vets_a_host_other_than_the_one_dialed(schemes: tuple[str, ...]) -> None:
    result = run_corpus(schemes)
    assert result["disagreements"] == []
    assert result["cases"] > 800
    assert result["agreed"] > 50  # the corpus really exercised accepted URLs
    assert result["refused"] + result["agreed"] + result["httpx_refused_whatwg_agreed"] == \
        result["cases"]


def test_corpus_is_read_with_invisible_code_points() -> None:
    inputs = [c["input"] for c in _cases()]
    assert any("\u00ad" in i or "\u200b" in i or "\ufeff" in i for i in inputs)
    assert any("\t" in i or "\n" in i for i in inputs)


if __name__ == "__main__":  # prints the counts for the report
    for s in (("http", "https"), ("http", "https", "ws", "wss", "ftp")):
        r = run_corpus(s)
        print(s, {k: (len(v) if isinstance(v, list) else v) for k, v in r.items()})
        for d in r["disagreements"][:40]:
            print("   ", d)
