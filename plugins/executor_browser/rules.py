"""Host rules for every browser request: the guard's net.http decision, then the dialed address.

Each request the page makes (navigation, redirect hop, subresource) is judged as if it were a
``net.http`` GET of that URL: by the guard when one is configured (``Guard.decide`` on a
``NetHttpOp``), otherwise by the profile's ``browser.use`` capabilities with the same host
patterns. Then the host's addresses are resolved and vetted with ``guard.ipaddr`` so loopback,
private and metadata addresses need a rule naming them, exactly as for ``net.http``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Protocol

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.ipaddr import is_address_allowed
from policy_engine.guard.urls import ParsedUrl, parse_url
from policy_engine.model import (
    BrowserCapability,
    CapabilityKind,
    Decision,
    ExecOp,
    NetHttpCapability,
    NetHttpOp,
    Profile,
)
from policy_engine.patterns.hosts import HostPattern


class DecidesOps(Protocol):
    """What the browser needs of a guard: ``policy_engine.guard.Guard`` satisfies it."""

    def decide(self, profile: Profile, op: ExecOp) -> Decision:
        """Allow or deny ``op`` under ``profile``."""
        ...



class RequestRules:
    """Judges one request URL under one profile; returns the canonical URL or raises.

    :param guard: when set, host, scheme, port and method are the guard's decision on a
        ``NetHttpOp(method="GET")``; otherwise the profile's ``browser.use`` capabilities decide.
    """

    def __init__(self, guard: DecidesOps | None = None) -> None:
        self.guard = guard

    def check(self, profile: Profile, url: str) -> ParsedUrl:
        """Raise ``CAPABILITY_BLOCKED`` unless ``url`` may be fetched; return it parsed."""
        parsed = parse_url(url)
        if self.guard is not None:
            decision = self.guard.decide(profile, NetHttpOp(method="GET", url=parsed.url))
            if not decision.allowed:
                raise PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    decision.reason or f"`{parsed.host}` is not allowed",
                    audit={"url": parsed.url, "decision_code": decision.code},
                )
        elif not _profile_admits(profile, parsed):
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"host `{parsed.host}` port {parsed.port} ({parsed.scheme}) is not allowed "
                "for the browser",
                audit={"url": parsed.url},
            )
        self._check_addresses(profile, parsed)
        return parsed

    def _check_addresses(self, profile: Profile, parsed: ParsedUrl) -> None:
        patterns = list(_host_patterns(profile))
        if parsed.ip is not None:
            addresses = [parsed.ip]
        else:
            try:
                infos = socket.getaddrinfo(parsed.host, parsed.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise PolicyEngineError(
                    ErrorCode.PROVIDER_UNAVAILABLE, f"cannot resolve `{parsed.host}`",
                    audit={"url": parsed.url, "error": str(exc)},
                ) from None
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        for ip in addresses:
            if not is_address_allowed(parsed.host, ip, patterns):
                raise PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    f"`{parsed.host}` resolves to a non-public address no rule names",
                    audit={"url": parsed.url, "ip": str(ip)},
                )


def _browser_caps(profile: Profile) -> Iterable[BrowserCapability | NetHttpCapability]:
    for pc in profile.capabilities:
        if pc.kind in (CapabilityKind.BROWSER_USE, CapabilityKind.NET_HTTP):
            for cap in pc.all_of:
                if isinstance(cap, BrowserCapability | NetHttpCapability):
                    yield cap


def _host_patterns(profile: Profile) -> Iterable[HostPattern]:
    for cap in _browser_caps(profile):
        for host in cap.hosts:
            yield HostPattern.of(host)


def _profile_admits(profile: Profile, url: ParsedUrl) -> bool:
    """Every member of one ``browser.use`` capability's ``all_of`` admits the URL (a meet)."""
    for pc in profile.capabilities:
        if pc.kind != CapabilityKind.BROWSER_USE:
            continue
        members = [c for c in pc.all_of if isinstance(c, BrowserCapability)]
        if members and all(_cap_admits(c, url) for c in members):
            return True
    return False


def _cap_admits(cap: BrowserCapability, url: ParsedUrl) -> bool:
    schemes = cap.schemes or ("https",)
    if url.scheme not in schemes:
        return False
    if cap.ports and url.port not in cap.ports:
        return False
    if not cap.ports and url.explicit_port:
        return False
    return any(HostPattern.of(h).matches(url.host, url.ip) for h in cap.hosts)
