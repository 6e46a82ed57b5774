"""Vetting and pinned resolution: guard decision, one lookup, every address vetted, then dialed.

Shared by the ``net.http`` executor and the restricted-mode proxy (``policy_engine.netproxy``)
so both refuse the same addresses for the same reasons.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import Decider, ExecContext
from policy_engine.guard.compiled import CompiledCap
from policy_engine.guard.guard import Guard
from policy_engine.guard.ipaddr import check_answer
from policy_engine.guard.matchers import NetMatcher
from policy_engine.guard.urls import ParsedUrl, parse_url
from policy_engine.model import Decision, Limits, NetHttpOp, Profile
from policy_engine.patterns.hosts import HostPattern

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

Resolver = Callable[[str, int], Sequence[IPAddress]]
"""``(host, port) -> addresses`` in the order they should be tried; raises ``OSError``."""


def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Resolve ``host`` with ``socket.getaddrinfo`` (TCP), keeping the first-seen order."""
    seen: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    ):
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in seen:
            seen.append(ip)
    return seen


@dataclass(frozen=True, slots=True)
class PinnedTarget:
    """A vetted destination: the canonical host the URL names and the addresses to dial."""

    host: str
    port: int
    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True, slots=True)
class Vetted:
    """A request the guard allowed, with what the allowing capability says about it.

    :param hosts: the capability's host patterns: what may name a private address explicitly.
    :param mime: one MIME allow-list per capability member (empty = unconstrained), plus the
        profile's summary list when it has one; a response must satisfy all of them.
    """

    url: ParsedUrl
    method: str
    decision: Decision
    hosts: tuple[HostPattern, ...]
    max_bytes_in: int | None
    max_bytes_out: int | None
    max_depth: int | None
    timeout_ms: int | None
    mime: tuple[tuple[str, ...], ...]
    cap: CompiledCap | None = None


def guard_for(ctx: ExecContext, fallback: Decider) -> Decider:
    """The guard to decide with mid-operation: the orchestrator's (``ctx.guard``) when it passed
    one, else the executor's own (``fallback``)."""
    return ctx.guard if ctx.guard is not None else fallback


def vet(guard: Decider, profile: Profile, op: NetHttpOp) -> Vetted:
    """Decide ``op`` with the guard and pick the capability that allowed it.

    Only a ``policy_engine.guard.Guard`` says which capability allowed (and so which hosts may
    name a private address); for any other decider the vetted target names none (fail closed).

    :raises PolicyEngineError: the decision's code when the guard denies.
    """
    decision = guard.decide(profile, op)
    url = parse_url(op.url)
    if not decision.allowed:
        code = ErrorCode(decision.code) if decision.code in _CODES else ErrorCode.CAPABILITY_BLOCKED
        raise PolicyEngineError(code, decision.reason or "refused by policy",
                                audit={"rule": decision.rule.id if decision.rule else None})
    method = op.method.upper()
    caps = guard.compiled(profile).caps.get("net.http", ()) if isinstance(guard, Guard) else ()
    chosen = next((c for c in caps if c.rule == decision.rule and c.admits((url, method))), None)
    summary = (profile.allow.mime_allow,) if profile.allow.mime_allow else ()
    if chosen is None:  # INVARIANT: the guard allowed through one of these; fail closed if not
        limits = decision.limits if decision.limits is not None else profile.limits
        return Vetted(url, method, decision, (), limits.max_bytes_in, limits.max_bytes_out,
                      limits.max_depth, min(profile.timeout_ms, limits.timeout_ms or 10**9),
                      summary)
    lim = chosen.limits
    mime = tuple(m.mime for m in chosen.members if isinstance(m, NetMatcher)) + summary
    return Vetted(url, method, decision, chosen.hosts, lim.max_bytes_in, lim.max_bytes_out,
                  lim.max_depth, lim.timeout_ms, mime, chosen)


TUNNEL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
"""The methods a policy can name; a rule must allow all of them before a tunnel is opened."""


def tunnel_refusal(guard: Decider, profile: Profile, vetted: Vetted) -> str | None:
    """Why a CONNECT tunnel to ``vetted.url`` may not be opened, or ``None`` when it may.

    A tunnel's requests are opaque to the proxy (TLS end to end), so it is only opened where no
    request inside it could be one the policy refuses: the allowing capability admits every
    method, has no condition (a condition may read the path, the method, the headers) and no
    MIME list (responses are not seen), and no forbid names the origin for some requests only
    (one that names it for all was already applied by the decision). Byte limits still apply,
    counted on the tunnel (``policy_engine.netproxy.proxy``).
    """
    cap = vetted.cap
    if cap is None or not isinstance(guard, Guard):
        return "no compiled policy rule says the tunnel may carry every request"
    rule = f"`{cap.rule.id}`" if cap.rule is not None else "allowing this origin"
    url = vetted.url
    if cap.condition is not None:
        return (f"the rule {rule} has a condition, which requests inside a tunnel cannot be "
                "checked against; use plain http through the proxy")
    missing = [m for m in TUNNEL_METHODS if not cap.admits((url, m))]
    if missing:
        return (f"the rule {rule} does not allow {', '.join(missing)}, and a tunnel could "
                "carry any method")
    if any(vetted.mime):
        return f"the rule {rule} constrains response types, which a tunnel hides"
    forbids = guard.compiled(profile).forbids.get("net.http")
    if forbids is not None and any(d.matcher.admits((url, m))
                                   for d in forbids.denies for m in TUNNEL_METHODS):
        return "a forbid names this origin for some requests, which a tunnel cannot tell apart"
    return None


def bounded(vetted: Vetted, limits: Limits) -> Vetted:
    """``vetted`` with no byte, depth or time allowance above the call's ``limits``
    (``ExecContext.limits``): a redirect to another rule's host never lifts them."""
    def tighter(a: int | None, b: int | None) -> int | None:
        return b if a is None else a if b is None else min(a, b)

    return replace(vetted, max_bytes_in=tighter(vetted.max_bytes_in, limits.max_bytes_in),
                   max_bytes_out=tighter(vetted.max_bytes_out, limits.max_bytes_out),
                   max_depth=tighter(vetted.max_depth, limits.max_depth),
                   timeout_ms=tighter(vetted.timeout_ms, limits.timeout_ms))


_CODES = frozenset(c.value for c in ErrorCode)


def pin(host: str, port: int, ip: IPAddress | None, patterns: Sequence[HostPattern],
        resolver: Resolver) -> PinnedTarget:
    """Resolve ``host`` once (unless ``ip`` is its literal) and vet every address.

    Every address must be admitted (``guard.ipaddr.check_answer``): metadata addresses never
    through a name, loopback and private only for a name the rule names exactly, and never an
    answer mixing public and non-public addresses.

    :param patterns: the allowing capability's host patterns (see ``Vetted.hosts``).
    :raises PolicyEngineError: ``PROVIDER.UNAVAILABLE`` when the name does not resolve,
        ``SANDBOX.CAPABILITY_BLOCKED`` when an address is refused.
    """
    if ip is not None:
        addresses: Sequence[IPAddress] = (ip,)
    else:
        try:
            addresses = resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise PolicyEngineError(
                ErrorCode.PROVIDER_UNAVAILABLE, f"host `{host}` does not resolve",
                audit={"host": host, "error": type(exc).__name__},
            ) from exc
        if not addresses:
            raise PolicyEngineError(
                ErrorCode.PROVIDER_UNAVAILABLE, f"host `{host}` has no address",
                audit={"host": host},
            )
    check_answer(host, addresses, patterns)
    return PinnedTarget(host=host, port=port, addresses=tuple(addresses))


def addresses_text(addresses: Iterable[IPAddress]) -> list[str]:
    """The addresses as strings, for evidence."""
    return [str(a) for a in addresses]
