"""Host patterns: exact names, ``*.suffix`` wildcards, ``*``, IP literals and CIDR blocks."""

from __future__ import annotations

import ipaddress
import unicodedata
from dataclasses import dataclass
from typing import Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

HostKind = Literal["exact", "suffix", "any", "ip", "cidr"]


def canonical_hostname(host: str) -> str:
    """Lowercase, strip one trailing dot and brackets, map to ASCII with :func:`to_ascii`.

    :raises ValueError: an invisible character or a name UTS-46 refuses.
    """
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h.endswith("."):
        h = h[:-1]
    return to_ascii(h)


def to_ascii(name: str) -> str:
    """The one internationalized-name mapping of the project: UTS-46 non-transitional
    processing, then IDNA 2008 ToASCII (the ``idna`` package), as WHATWG URL and httpx do.

    Python's ``"idna"`` codec is IDNA 2003 (transitional): it folds ``ß`` into ``ss`` and
    ``ς`` into ``σ`` and drops joiners, so a pattern would name another host than the URL
    parser (``policy_engine.guard.urls``) and the client dial. ASCII names are lowercased and
    their ``xn--`` labels must decode. Invisible characters (joiners, soft hyphens, format
    and separator characters) are refused, as URLs refuse them.

    :raises ValueError: why ``name`` has no ASCII form.
    """
    # ``idna`` (its tables cost ≈ 5–15 ms to import) only for names that need it: most never do
    if name.isascii():
        ascii_name = name.lower()
        if "xn--" in ascii_name:
            import idna

            try:
                idna.decode(ascii_name)
            except (idna.IDNAError, UnicodeError) as exc:
                raise ValueError(f"invalid international name `{name}`: {exc}") from None
        return ascii_name
    hidden = next((c for c in name if unicodedata.category(c)[0] in "CZ"), None)
    if hidden is not None:
        raise ValueError(f"invisible or whitespace character U+{ord(hidden):04X} in a host name")
    import idna

    try:
        return idna.encode(name, uts46=True, transitional=False).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise ValueError(f"invalid international name `{name}`: {exc}") from None


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
            if _ends_in_number(suffix):
                raise ValueError(f"`{raw}` ends in a number: URLs read such a host as an IPv4 "
                                 "address, so a suffix of it matches nothing; use a CIDR block")
            return HostPattern(raw, "suffix", suffix)
        if "*" in raw:
            raise ValueError(f"`*` is only allowed as a whole leading label in `{raw}`")
        name = canonical_hostname(raw)
        _check_labels(raw, name)
        if _ends_in_number(name):  # e.g. full-width digits, folded: the address URLs read
            try:
                ip4 = ipaddress.IPv4Address(name)
            except ValueError:
                raise ValueError(
                    f"`{raw}` ends in a number but is not a dotted-decimal IPv4 address: URLs "
                    "read such a host as an address; write the address as a.b.c.d") from None
            return HostPattern(raw, "ip", str(ip4), ipaddress.ip_network(ip4))
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


def _ends_in_number(name: str) -> bool:
    """WHATWG's "ends in a number": the last label is decimal digits or ``0x`` hex."""
    last = name.rsplit(".", 1)[-1].lower()
    if last.isdigit():
        return True
    return last.startswith("0x") and all(c in "0123456789abcdef" for c in last[2:])


def _check_labels(raw: str, name: str) -> None:
    if not name or len(name) > 253:
        raise ValueError(f"invalid host `{raw}`")
    for label in name.split("."):
        if not label or len(label) > 63 or label.startswith("-") or label.endswith("-"):
            raise ValueError(f"invalid host label in `{raw}`")
        if not all(c.isalnum() or c in "-_" for c in label):
            raise ValueError(f"invalid character in host `{raw}`")
