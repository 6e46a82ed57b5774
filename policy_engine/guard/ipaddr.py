"""IP addresses: every IPv4 notation parsed, and addresses classified as private, metadata, ….

Executors call :func:`check_answer` (or :func:`check_address`) on the addresses DNS returns, so
the address that is dialed is the one that was vetted (DESIGN.md §3). What may be reached:

- a public address: whatever the host patterns allow;
- a metadata address (``METADATA_ADDRESSES``): only as the URL's own IP literal, named by an
  IP-literal pattern of the allowing rule; never through a name, whatever the rule names;
- any other non-public address through a name (DNS): loopback and private only, and only when
  the allowing rule names that host exactly (never ``*``, ``*.suffix``, nor an IP or CIDR
  pattern, which would let any name the rule admits rebind into the range);
- any other non-public address as the URL's IP literal: when an IP or CIDR pattern contains it;
- a DNS answer mixing public and non-public addresses: never.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.patterns.hosts import HostPattern

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a) for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean instance metadata
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.123",  # AWS time sync
        "169.254.169.253",  # AWS VPC DNS
        "100.100.100.200",  # Alibaba Cloud metadata
        "168.63.129.16",  # Azure wire server: public space, but a platform endpoint
        "192.0.0.192",  # Oracle Cloud (classic) metadata
        "169.254.170.23",  # AWS EKS pod identity agent
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # AWS DNS over IPv6
        "fe80::a9fe:a9fe",  # OpenStack / AWS metadata on an IPv6 link-local address
        "fd20:ce::254",  # Google Compute Engine metadata over IPv6
    )
)

NAME_REACHABLE: frozenset[str] = frozenset({"loopback", "private"})
"""Non-public classes a name (resolved by DNS) may reach, when the rule names it exactly."""

# Ordered: the first containing network names the class. Specific ranges come before the
# broad ones that contain them (CGNAT before "reserved", link-local before "private").
_RANGES: tuple[tuple[_V4 | _V6, str], ...] = tuple(
    (ipaddress.ip_network(net), cls) for net, cls in (
        ("0.0.0.0/8", "unspecified"),  # Linux dials 0.0.0.0 as the local host
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("10.0.0.0/8", "private"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("100.64.0.0/10", "private"),  # carrier-grade NAT: a provider's internal network
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "reserved"),
        ("240.0.0.0/4", "reserved"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "reserved"),
        ("198.18.0.0/15", "reserved"),
        ("198.51.100.0/24", "reserved"),
        ("203.0.113.0/24", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "private"),  # deprecated site-local
        ("fc00::/7", "private"),
        ("ff00::/8", "multicast"),
        ("100::/64", "reserved"),
        ("2001:db8::/32", "reserved"),
        ("2001:2::/48", "reserved"),
    )
)
_V4_RANGES: tuple[tuple[int, int, str], ...] = tuple(
    (int(net.network_address), int(net.netmask), cls) for net, cls in _RANGES if net.version == 4)
"""The IPv4 rows of ``_RANGES`` in the same order, as (network, mask) integers."""
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_V4_COMPAT = ipaddress.IPv6Network("::/96")
_SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")
"""IPv4-translated addresses (RFC 2765 SIIT, ``::ffff:0:a.b.c.d``): a NAT46 translator delivers
them to the embedded IPv4 address, like the mapped form one bit away."""


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, SIIT-translated, 6to4, NAT64, Teredo,
    compatible)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _SIIT:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    for net in _NAT64:
        if ip in net:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _V4_COMPAT and int(ip) > 1:  # deprecated ::a.b.c.d; `::` and `::1` are v6 proper
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def classify(ip: IPAddress | str) -> str | None:
    """Return the class of a non-public address, or ``None`` for a public one.

    Classes: ``loopback``, ``private``, ``link-local``, ``metadata``, ``multicast``,
    ``unspecified``, ``reserved``. IPv6 addresses embedding an IPv4 one are classified by the
    embedded address first, since that is where the packet ends up.
    """
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip.strip("[]"))
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if isinstance(ip, ipaddress.IPv4Address):  # the IPv4 rows by integer mask, same order
        value = int(ip)
        for network, mask, v4_cls in _V4_RANGES:
            if value & mask == network:
                return v4_cls
        if ip.is_reserved or ip.is_private or not ip.is_global:
            return "reserved"
        return None
    inner = embedded_ipv4(ip)
    if inner is not None:
        inner_class = classify(inner)
        if inner_class is not None:
            return inner_class
    for net, cls in _RANGES:
        if ip.version == net.version and ip in net:
            return cls
    if ip.is_reserved or ip.is_private or not ip.is_global:
        return "reserved"
    return None


def is_address_allowed(
    host: str, ip: IPAddress, patterns: Iterable[HostPattern | str]
) -> bool:
    """Whether ``ip`` (reached as ``host``: a name, or the address's own literal) may be dialed
    under ``patterns`` (the allowing rule's hosts); see the module docstring."""
    cls = classify(ip)
    if cls is None:
        return True
    hps = [p if isinstance(p, HostPattern) else HostPattern.of(p) for p in patterns]
    inner = embedded_ipv4(ip)
    targets = (ip,) if inner is None else (ip, inner)
    if not _is_literal(host):  # through DNS: an exact name, loopback or private only
        return cls in NAME_REACHABLE and any(p.kind == "exact" and p.value == host for p in hps)
    if cls == "metadata":  # only the address itself, named as a literal
        return any(p.kind == "ip" and p.network is not None and t.version == p.network.version
                   and t in p.network for p in hps for t in targets)
    return any(p.kind in ("ip", "cidr") and p.names_address(host, t)
               for p in hps for t in targets)


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def check_address(host: str, ip: IPAddress, patterns: Iterable[HostPattern | str]) -> None:
    """Raise ``CAPABILITY_BLOCKED`` unless :func:`is_address_allowed`; for executors after DNS."""
    if not is_address_allowed(host, ip, patterns):
        raise PolicyEngineError(
            ErrorCode.CAPABILITY_BLOCKED,
            f"{classify(ip)} address of `{host}` is not named by any rule",
            audit={"host": host, "ip": str(ip)},
        )


def check_answer(host: str, addresses: Sequence[IPAddress],
                 patterns: Sequence[HostPattern]) -> None:
    """Vet every address DNS gave for ``host`` before any is dialed.

    :raises PolicyEngineError: ``CAPABILITY_BLOCKED`` when the answer mixes public and
        non-public addresses (which one a client picks, or a rebinding resolver serves next, is
        not ours to guess), or when one address is not allowed (:func:`is_address_allowed`).
    """
    audit = {"host": host, "addresses": [str(a) for a in addresses]}
    public = [classify(a) is None for a in addresses]
    if any(public) and not all(public):
        raise PolicyEngineError(
            ErrorCode.CAPABILITY_BLOCKED,
            f"host `{host}` resolves to both public and non-public addresses", audit=audit)
    refused = [a for a in addresses if not is_address_allowed(host, a, patterns)]
    if refused:
        first = refused[0]
        why = "never reachable through a name" if classify(first) == "metadata" \
            else "not named by the rule"
        raise PolicyEngineError(
            ErrorCode.CAPABILITY_BLOCKED,
            f"host `{host}` resolves to a {classify(first)} address `{first}` ({why})",
            audit={**audit, "refused": [str(a) for a in refused]})


_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED = re.compile(rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}")


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """Parse an IPv4 host the way WHATWG URL and ``inet_aton`` do, or return ``None``.

    Accepts 1 to 4 parts, each decimal, octal (leading ``0``) or hex (``0x``); the last part
    fills the remaining bytes (``127.1``, ``2130706433``, ``0x7f.1``, ``0177.0.0.1``). One
    trailing dot is dropped. Raises ``ValueError`` when the host *ends in a number* but is not a
    valid address, since such a host must never fall through to DNS.
    """
    m = _DOTTED.fullmatch(host)
    if m is not None:  # canonical dotted decimal: what the general reading below gives too
        a, b, c, d = m.groups()
        return ipaddress.IPv4Address((int(a) << 24) | (int(b) << 16) | (int(c) << 8) | int(d))
    return parse_ipv4_parts(host)


def parse_ipv4_parts(host: str) -> ipaddress.IPv4Address | None:
    """:func:`parse_ipv4` without the dotted-decimal shortcut (every notation, part by part)."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if not _is_number(parts[-1]):
        return None
    if len(parts) > 4:
        raise ValueError(f"invalid IPv4 address `{host}`")
    nums: list[int] = []
    for part in parts:
        n = _parse_part(part)
        if n is None:
            raise ValueError(f"invalid IPv4 address `{host}`")
        nums.append(n)
    last = nums.pop()
    if any(n > 255 for n in nums) or last >= 256 ** (4 - len(nums)):
        raise ValueError(f"invalid IPv4 address `{host}`")
    value = last
    for i, n in enumerate(nums):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def _is_number(part: str) -> bool:
    if part.isascii() and part.isdigit():
        return True
    low = part.lower()
    return low.startswith("0x") and all(c in "0123456789abcdef" for c in low[2:])


def _parse_part(part: str) -> int | None:
    if not part or not part.isascii():
        return None
    low = part.lower()
    if low.startswith("0x"):
        digits, base = low[2:], 16
        if not digits:  # WHATWG reads `0x` as 0, inet_aton refuses it: ambiguous, so refused
            return None
    elif len(low) > 1 and low.startswith("0"):
        digits, base = low[1:], 8
    else:
        digits, base = low, 10
    allowed = "0123456789abcdef"[:base]
    if not all(c in allowed for c in digits):
        return None
    return int(digits, base)
