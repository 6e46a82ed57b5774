"""Host-pattern algebra: the meet of exact names, ``*.suffix``, ``*``, IP literals and CIDRs.

Semantics follow :meth:`HostPattern.matches`: names (exact, suffix) admit hostnames, IP and CIDR
patterns admit IP literals, ``*`` admits everything. Two names or two networks have an exact
meet. A name met with a network is kept as a conjunction rather than declared empty: whether a
name may be checked against its resolved address is the guard's business, and the meet must
never be empty wrongly.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from itertools import combinations

from policy_engine.patterns.hosts import HostPattern

_NAMES = ("exact", "suffix")
_NETS = ("ip", "cidr")


@lru_cache(maxsize=8192)
def host_of(pattern: str) -> HostPattern:
    return HostPattern.of(pattern)


@lru_cache(maxsize=8192)
def canonical_host(pattern: str) -> str:
    """The canonical spelling: lowercase name, ``*.suffix``, ``*``, or the network's text."""
    h = host_of(pattern)
    if h.kind == "suffix":
        return "*." + h.value
    if h.kind == "any":
        return "*"
    if h.kind == "cidr":
        return str(h.network)
    return h.value


def host_contains(a: str, b: str) -> bool:
    """Exact: every host ``b`` admits, ``a`` admits."""
    return meet_hosts(a, b) == (canonical_host(b),)


@lru_cache(maxsize=8192)
def meet_hosts(a: str, b: str) -> tuple[str, ...]:
    """The meet of two host patterns as a conjunction: ``()``, ``(c,)`` or ``(a, b)``."""
    # sorted operands make the answer structurally commutative, not just equal as sets
    ca, cb = sorted((canonical_host(a), canonical_host(b)))
    if ca == cb:
        return (ca,)
    ha, hb = host_of(ca), host_of(cb)
    if ha.kind == "any":
        return (cb,)
    if hb.kind == "any":
        return (ca,)
    if ha.kind in _NAMES and hb.kind in _NAMES:
        return _meet_names(ha, hb)
    if ha.kind in _NETS and hb.kind in _NETS:
        na, nb = ha.network, hb.network
        # INVARIANT: ip/cidr patterns always carry their network
        assert na is not None
        assert nb is not None
        if na.version != nb.version:
            return ()
        # CIDR blocks either nest or are disjoint
        if na.subnet_of(nb):  # type: ignore[arg-type]  # same version checked just above
            return (ca,)
        if nb.subnet_of(na):  # type: ignore[arg-type]  # same version checked just above
            return (cb,)
        return ()
    return tuple(sorted((ca, cb)))


def _meet_names(ha: HostPattern, hb: HostPattern) -> tuple[str, ...]:
    if ha.kind == "exact" and hb.kind == "exact":
        return ()  # equal names were answered by the caller
    if ha.kind == "suffix" and hb.kind == "suffix":
        # a host ending in both suffixes makes the shorter a label-suffix of the longer
        if hb.value.endswith("." + ha.value):
            return ("*." + hb.value,)
        if ha.value.endswith("." + hb.value):
            return ("*." + ha.value,)
        return ()
    exact, suffix = (ha, hb) if ha.kind == "exact" else (hb, ha)
    return (exact.value,) if exact.value.endswith("." + suffix.value) else ()


def simplify_hosts(hosts: Iterable[str]) -> tuple[str, ...]:
    """Fold a conjunction of host patterns pairwise; ``()`` if it provably admits nothing."""
    work = sorted({canonical_host(h) for h in hosts})
    changed = True
    while changed and len(work) > 1:
        changed = False
        for x, y in combinations(work, 2):
            m = meet_hosts(x, y)
            if not m:
                return ()
            if len(m) == 1:
                work = sorted({*(h for h in work if h not in (x, y)), m[0]})
                changed = True
                break
    return tuple(work)
