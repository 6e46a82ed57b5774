"""Host patterns: exact names, ``*.suffix`` wildcards, ``*``, IP literals and CIDR blocks."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

HostKind = Literal["exact", "suffix", "any", "ip", "cidr"]


def canonical_hostname(host: str) -> str:
    """Lowercase, strip one trailing dot, IDNA-encode non-ASCII labels."""
    h = host.strip().rstrip(".").lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if not h.isascii():
        h = h.encode("idna").decode("ascii")
    return h


def validate_host_pattern(pattern: str) -> str | None:
    """Return why ``pattern`` is not a valid host pattern, or ``None``."""
    try:
        HostPattern.of(pattern)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One host pattern. ``names_explicitly`` is what lifts the private-address refusal."""

    pattern: str
    kind: HostKind
    value: str
    network: IPNetwork | None = None

    @staticmethod
    def of(pattern: str) -> HostPattern:
        raw = pattern.strip()
        if not raw:
            raise ValueError("empty host pattern")
        if raw == "*":
            return HostPattern(raw, "any", "")
        if "/" in raw:
            try:
                net = ipaddress.ip_network(raw.strip("[]"), strict=False)
            except ValueError as exc:
                raise ValueError(f"invalid CIDR block `{raw}`") from exc
            return HostPattern(raw, "cidr", str(net), net)
        try:
            ip = ipaddress.ip_address(raw.strip("[]"))
        except ValueError:
            pass
        else:
            return HostPattern(raw, "ip", str(ip), ipaddress.ip_network(ip))
        if raw.startswith("*."):
            suffix = canonical_hostname(raw[2:])
            _check_labels(raw, suffix)
            return HostPattern(raw, "suffix", suffix)
        if "*" in raw:
            raise ValueError(f"`*` is only allowed as a whole leading label in `{raw}`")
        name = canonical_hostname(raw)
        _check_labels(raw, name)
        return HostPattern(raw, "exact", name)

    def matches(self, host: str, ip: IPAddress | None = None) -> bool:
        """``host`` is canonical (see guard.urls); ``ip`` is set when the host is an IP literal."""
        kind = self.kind
        if kind == "exact":
            return host == self.value
        if kind == "suffix":
            return host.endswith("." + self.value) and ip is None
        if kind == "any":
            return True
        if ip is None or self.network is None:
            return False
        return ip.version == self.network.version and ip in self.network

    def names_address(self, host: str, ip: IPAddress) -> bool:
        """Whether this pattern names ``ip`` explicitly (exact host, IP literal or CIDR)."""
        if self.kind == "exact":
            return host == self.value
        if self.kind in ("ip", "cidr") and self.network is not None:
            return ip.version == self.network.version and ip in self.network
        return False


def _check_labels(raw: str, name: str) -> None:
    if not name or len(name) > 253:
        raise ValueError(f"invalid host `{raw}`")
    for label in name.split("."):
        if not label or len(label) > 63 or label.startswith("-") or label.endswith("-"):
            raise ValueError(f"invalid host label in `{raw}`")
        if not all(c.isalnum() or c in "-_" for c in label):
            raise ValueError(f"invalid character in host `{raw}`")
