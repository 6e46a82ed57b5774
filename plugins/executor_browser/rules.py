"""Host rules for every browser request: the guard's browser.use decision, then the address.

Each request the page makes (navigation, redirect hop, subresource) is judged as a browser
operation on that URL (``browser.nav`` needing the ``open`` scope, or ``browser.screenshot`` for a
screenshot op): by the call's guard when there is one (the orchestrator's, ``ExecContext.guard``,
else the executor's configured one), so rule conditions, forbids and deny-lists apply to every
subrequest; otherwise by the profile's ``browser.use`` capabilities alone. Then the host's
addresses are resolved and vetted with ``guard.ipaddr.check_answer``: loopback and private
addresses need the *policy rule* that allowed the request to name them (the host exactly, or the
literal's address), metadata addresses are never reached through a name, and an answer mixing
public and non-public addresses is refused, exactly as for ``net.http``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.guard import Guard
from policy_engine.guard.ipaddr import check_answer
from policy_engine.guard.urls import ParsedUrl, parse_url
from policy_engine.model import (
    BrowserCapability,
    BrowserNavOp,
    BrowserScreenshotOp,
    CapabilityKind,
    Decision,
    ExecOp,
    NetHttpCapability,
    Profile,
)
from policy_engine.netproxy.resolve import IPAddress, Resolver, system_resolver
from policy_engine.patterns.hosts import HostPattern


class DecidesOps(Protocol):
    """What the browser needs of a guard: ``policy_engine.guard.Guard`` satisfies it."""

    def decide(self, profile: Profile, op: ExecOp) -> Decision:
        """Allow or deny ``op`` under ``profile``."""
        ...



class RequestRules:
    """Judges one request URL under one profile; returns the canonical URL or raises.

    :param guard: the configured guard, used when a call brings none of its own; when a guard
        decides, the request is a ``browser.nav`` (or ``browser.screenshot``) of its URL; with no
        guard at all the profile's ``browser.use`` capabilities decide.
    :param resolver: name resolution (``net.http``'s; tests inject a loopback DNS server).
    """

    def __init__(self, guard: DecidesOps | None = None, *,
                 resolver: Resolver = system_resolver) -> None:
        self.guard = guard
        self.resolver = resolver

    def check(self, profile: Profile, url: str, guard: DecidesOps | None = None, *,
              screenshot: bool = False) -> ParsedUrl:
        """Raise ``CAPABILITY_BLOCKED`` unless ``url`` may be fetched; return it parsed.

        :param guard: the call's guard (``ExecContext.guard``); wins over the configured one.
        :param screenshot: decide with the ``screenshot`` scope instead of ``open``.
        """
        parsed = parse_url(url)
        decider = guard if guard is not None else self.guard
        if decider is not None:
            op: BrowserNavOp | BrowserScreenshotOp = (
                BrowserScreenshotOp(url=parsed.url) if screenshot
                else BrowserNavOp(url=parsed.url, extract="none"))
            decision = decider.decide(profile, op)
            if not decision.allowed:
                raise PolicyEngineError(
                    ErrorCode.CAPABILITY_BLOCKED,
                    decision.reason or f"`{parsed.host}` is not allowed",
                    audit={"url": parsed.url, "decision_code": decision.code},
                )
            patterns = _named_hosts(decider, profile, decision, op, parsed)
        elif not _profile_admits(profile, parsed):
            raise PolicyEngineError(
                ErrorCode.CAPABILITY_BLOCKED,
                f"host `{parsed.host}` port {parsed.port} ({parsed.scheme}) is not allowed "
                "for the browser",
                audit={"url": parsed.url},
            )
        else:
            patterns = list(_host_patterns(profile))
        self._check_addresses(parsed, patterns)
        return parsed

    def _check_addresses(self, parsed: ParsedUrl, patterns: list[HostPattern]) -> None:
        """Resolve once and vet the whole answer as ``net.http`` does (``check_answer``)."""
        if parsed.ip is not None:
            addresses: list[IPAddress] = [parsed.ip]
        else:
            try:
                addresses = list(self.resolver(parsed.host, parsed.port))
            except (OSError, UnicodeError) as exc:
                raise PolicyEngineError(
                    ErrorCode.PROVIDER_UNAVAILABLE, f"cannot resolve `{parsed.host}`",
                    audit={"url": parsed.url, "error": type(exc).__name__},
                ) from None
            if not addresses:
                raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                        f"`{parsed.host}` has no address",
                                        audit={"url": parsed.url})
        check_answer(parsed.host, addresses, patterns)


def _named_hosts(guard: DecidesOps, profile: Profile, decision: Decision,
                 op: BrowserNavOp | BrowserScreenshotOp, url: ParsedUrl) -> list[HostPattern]:
    """The hosts of the rule that allowed ``op``: what may name a private address. Only a
    ``Guard`` can say which rule that is; any other decider names none (fail closed)."""
    if not isinstance(guard, Guard):
        return []
    needed = frozenset({"screenshot"} if isinstance(op, BrowserScreenshotOp) else {"open"})
    for c in guard.compiled(profile).caps.get("browser.use", ()):
        if c.rule == decision.rule and c.admits((url, needed)):
            return list(c.hosts)
    return []


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
