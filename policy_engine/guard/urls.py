"""The one URL parser of the project: strict, absolute, http(s) by default, IP literals normalized.

Everything that judges or dials a URL goes through :func:`parse_url`, so the guard vets the same
scheme, host and port the executor connects to. It follows the WHATWG URL standard for the
special schemes where the two agree with httpx, and refuses what clients read differently
(userinfo, backslashes, whitespace, percent-encoded hosts, relative references); the corpus
test ``tests/unit/test_url_corpus.py`` checks that against the WHATWG data and httpx.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address
from urllib.parse import unquote_to_bytes

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.ipaddr import IPAddress, parse_ipv4
from policy_engine.guard.paths import quote
from policy_engine.patterns.hosts import to_ascii

DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
HTTP_SCHEMES: frozenset[str] = frozenset({"http", "https"})
MAX_URL_LENGTH = 8192

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_ASCII_BAD = re.compile(r"[\x00-\x20\x7f\\]")
_PORT = re.compile(r"[0-9]{0,5}")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_IPV6_CHARS = re.compile(r"[0-9A-Fa-f:.]+")
_PATH_SAFE = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/%"
)
_QUERY_SAFE = _PATH_SAFE | frozenset("?")

# The common case, read by one regex (see parse_fast): a lowercase http(s) URL whose host is a
# name of ASCII LDH labels (any case, one trailing dot: lowered and dropped as the full parser
# does) ending in a label that starts with a letter (so never an IPv4 number), an
# optional decimal port, and a path and query of characters that need no encoding, no `%`
# (no percent-encoded dot or host) and no `@`; no fragment, userinfo, backslash or whitespace.
# A host may also be an IPv4 address in canonical dotted decimal (no leading zero, each part at
# most 255): the address is the number it spells and its canonical text is itself.
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_FAST = re.compile(
    r"(https?)://"
    r"((?:[a-zA-Z0-9_](?:[a-zA-Z0-9_-]{0,61}[a-zA-Z0-9_])?\.)*"
    r"[a-zA-Z](?:[a-zA-Z0-9_-]{0,61}[a-zA-Z0-9_])?\.?"
    rf"|{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET})"
    r"(?::([0-9]{1,5}))?"
    r"(/[A-Za-z0-9._~!$&'()*+,;=:/-]*)?"
    r"(?:\?([A-Za-z0-9._~!$&'()*+,;=:/?-]*))?"
)


@dataclass(frozen=True, slots=True)
class ParsedUrl:
    """A vetted absolute URL. ``host`` is canonical (IDNA ASCII, lowercase, no trailing dot,
    IPv6 without brackets); ``ip`` is set when the host is an IP literal; ``port`` is explicit
    or the scheme default; ``query`` is ``None`` when absent. The fragment is dropped.
    """

    scheme: str
    host: str
    ip: IPAddress | None
    port: int
    explicit_port: bool
    path: str
    query: str | None

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.explicit_port else host

    @property
    def url(self) -> str:
        """The canonical form; executors dial this string, never the raw input."""
        q = "" if self.query is None else "?" + self.query
        return f"{self.scheme}://{self.netloc}{self.path}{q}"

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


_NEW = object.__new__
_SLOTS = tuple(ParsedUrl.__dict__[f].__set__ for f in (
    "scheme", "host", "ip", "port", "explicit_port", "path", "query"))


def _parsed(scheme: str, host: str, ip: IPAddress | None, port: int, explicit: bool, path: str,
            query: str | None) -> ParsedUrl:
    """``ParsedUrl(...)`` without the frozen ``__init__``'s ``object.__setattr__`` per field
    (0.5 → 0.3 µs): the slots are written once, before anyone holds the object."""
    u: ParsedUrl = _NEW(ParsedUrl)
    s0, s1, s2, s3, s4, s5, s6 = _SLOTS
    s0(u, scheme)
    s1(u, host)
    s2(u, ip)
    s3(u, port)
    s4(u, explicit)
    s5(u, path)
    s6(u, query)
    return u


def _blocked(reason: str, url: str) -> PolicyEngineError:
    return PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, reason, audit={"url": url[:2048]})


def _invalid(reason: str, url: str) -> PolicyEngineError:
    return PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, reason, audit={"url": url[:2048]})


def parse_url(url: str, *, schemes: Iterable[str] | None = None) -> ParsedUrl:
    """Parse and vet an absolute URL.

    :param schemes: schemes accepted (lowercase); default ``http`` and ``https``.
    :raises PolicyEngineError: ``SCHEMA.VALIDATION_FAILED`` when it is not an absolute URL at
        all; ``SANDBOX.CAPABILITY_BLOCKED`` for forms clients disagree on or that smuggle a
        second host (userinfo, backslashes, whitespace or control characters, percent-encoded
        or invalid hosts, other schemes).
    """
    if schemes is None and type(url) is str:
        hit = _SEEN.get(url)
        if hit is not None:
            return hit
        fast = parse_fast(url)
        if fast is not None:
            if len(url) <= _SEEN_URL_MAX:
                if len(_SEEN) >= _SEEN_SIZE:  # a bound, not an LRU: a miss costs one parse
                    _SEEN.clear()
                _SEEN[url] = fast
            return fast
    return parse_full(url, schemes=schemes)


_SEEN: dict[str, ParsedUrl] = {}
"""Canonical URLs already parsed (the fast path's answers; a ``ParsedUrl`` is immutable, and
parsing is a function of the string alone): an agent calls the same few endpoints again and
again, and the regex costs ≈ 1 µs of a ≈ 4 µs decision. Bounded in count and URL length."""
_SEEN_SIZE = 2048
_SEEN_URL_MAX = 512


def parse_fast(url: str) -> ParsedUrl | None:
    """The :func:`parse_full` answer for a URL already in canonical form (``_FAST``), else
    ``None``. ``tests/unit/test_guard_urls.py`` checks the two agree on generated URLs."""
    m = _FAST.fullmatch(url)
    if m is None or len(url) > MAX_URL_LENGTH:
        return None
    scheme, host, a, b, c, d, port_text, path, query = m.groups()
    ip: IPAddress | None = None
    if a is not None:
        ip = IPv4Address((int(a) << 24) | (int(b) << 16) | (int(c) << 8) | int(d))
    else:
        if host[-1] == ".":
            host = host[:-1]
        if not host.islower():
            host = host.lower()
        if len(host) > 253 or "xn--" in host:  # too long, or punycode to verify: the full path
            return None
    if path is None:
        path = "/"
    elif "/." in path:  # possibly a dot segment to remove: the full path
        return None
    default = 443 if scheme == "https" else 80
    if port_text is None:
        return _parsed(scheme, host, ip, default, False, path, query)
    port = int(port_text)
    if not 0 < port <= 65535:
        return None
    return _parsed(scheme, host, ip, port, port != default, path, query)


def parse_full(url: str, *, schemes: Iterable[str] | None = None) -> ParsedUrl:
    """:func:`parse_url` without the fast path: every check, for every URL."""
    if not isinstance(url, str) or not url:
        raise _invalid("url is empty or not a string", repr(url))
    if len(url) > MAX_URL_LENGTH:
        raise _invalid("url is too long", url)
    if _ASCII_BAD.search(url) is not None:
        raise _blocked("url contains whitespace, a control character or a backslash", url)
    if not url.isascii() and any(unicodedata.category(c)[0] in "CZ" for c in url):
        raise _blocked("url contains invisible or whitespace characters", url)
    m = _SCHEME.match(url)
    if m is None:
        raise _invalid(f"url {quote(url)} is not absolute", url)
    scheme = m.group(1).lower()
    allowed = HTTP_SCHEMES if schemes is None else frozenset(schemes)
    if scheme not in allowed:
        raise _blocked(f"scheme {quote(scheme)} is not accepted", url)
    rest = url[m.end():]
    if not rest.startswith("//") or rest.startswith("///"):
        raise _invalid(f"url {quote(url)} has no `//host` part", url)
    rest = rest[2:]
    end = len(rest)
    for sep in "/?#":
        i = rest.find(sep)
        if i != -1 and i < end:
            end = i
    authority, rest = rest[:end], rest[end:]
    if "@" in authority:
        raise _blocked("urls with credentials (`user:pass@`) are not accepted", url)
    host, ip, port_text = _split_authority(authority, url)
    if port_text:
        if _PORT.fullmatch(port_text) is None or not 0 < int(port_text) <= 65535:
            raise _invalid(f"invalid port {quote(port_text)}", url)
        port, explicit = int(port_text), True
    elif scheme in DEFAULT_PORTS:
        port, explicit = DEFAULT_PORTS[scheme], False
    else:
        raise _invalid(f"scheme {quote(scheme)} needs an explicit port", url)
    if explicit and port == DEFAULT_PORTS.get(scheme):
        explicit = False
    rest = rest.split("#", 1)[0]
    raw_path, sep, raw_query = rest.partition("?")
    path = _normalize_url_path(_encode(raw_path, _PATH_SAFE))
    query = _encode(raw_query, _QUERY_SAFE) if sep else None
    return ParsedUrl(scheme, host, ip, port, explicit, path, query)


def _split_authority(authority: str, url: str) -> tuple[str, IPAddress | None, str]:
    """Return (canonical host, ip, port text) of an authority without userinfo."""
    if authority.startswith("["):
        close = authority.find("]")
        if close == -1:
            raise _invalid("unterminated IPv6 address", url)
        literal, after = authority[1:close], authority[close + 1:]
        if after and not after.startswith(":"):
            raise _invalid("junk after the IPv6 address", url)
        if _IPV6_CHARS.fullmatch(literal) is None:  # also keeps out `%zone` identifiers
            raise _blocked(f"invalid IPv6 address {quote(literal)}", url)
        try:
            ip6 = ipaddress.IPv6Address(literal)
        except ValueError:
            raise _blocked(f"invalid IPv6 address {quote(literal)}", url) from None
        return ip6.compressed, ip6, after[1:]
    raw_host, _, port_text = authority.partition(":")
    if not raw_host:
        raise _invalid("url has an empty host", url)
    if "%" in raw_host:
        # WHATWG clients decode `%xx` in a host, httpx and DNS do not: refuse the ambiguity,
        # naming the decoded host so the audit shows what it was aiming at.
        try:
            decoded = unquote_to_bytes(raw_host).decode("utf-8")
        except UnicodeDecodeError:
            decoded = raw_host
        raise _blocked(f"percent-encoded host {quote(decoded)} is not accepted", url)
    host = _canonical_host(raw_host, url)
    try:
        ip4 = parse_ipv4(host)
    except ValueError:
        raise _blocked(f"invalid IPv4 address {quote(host)}", url) from None
    if ip4 is not None:
        if raw_host.endswith("."):
            # WHATWG reads `127.1.` as an address, inet_aton refuses it and httpx would ask
            # DNS for the name: clients disagree, so it is refused
            raise _blocked(f"numeric host {quote(raw_host)} with a trailing dot is ambiguous", url)
        return str(ip4), ip4, port_text
    return host, None, port_text


def _canonical_host(raw: str, url: str) -> str:
    try:  # the mapping host patterns use too (UTS-46 non-transitional, IDNA 2008)
        host = to_ascii(raw)
    except ValueError:
        raise _blocked(f"invalid international host {quote(raw)}", url) from None
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > 253:
        raise _blocked(f"invalid host {quote(raw)}", url)
    for label in host.split("."):
        if _LABEL.fullmatch(label) is None:
            raise _blocked(f"invalid host {quote(raw)}", url)
    return host


def _encode(text: str, safe: frozenset[str]) -> str:
    if all(c in safe for c in text):
        return text
    return "".join(
        c if c in safe else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in text
    )


def _normalize_url_path(path: str) -> str:
    """RFC 3986 ``remove_dot_segments`` (``%2e`` counts as a dot, as in WHATWG)."""
    if not path:
        return "/"
    segs = path.split("/")[1:]
    if not any(s.lower() in (".", "..", "%2e", "%2e%2e", ".%2e", "%2e.") for s in segs):
        return path
    out: list[str] = []
    for i, seg in enumerate(segs):
        low = seg.lower()
        last = i == len(segs) - 1
        if low in ("..", "%2e%2e", ".%2e", "%2e."):
            if out:
                out.pop()
            if last:
                out.append("")
        elif low in (".", "%2e"):
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out)


def mime_allowed(content_type: str | None, allowed: Iterable[str]) -> bool:
    """Whether a response ``Content-Type`` is in ``allowed`` (``type/*`` and ``*/*`` allowed).

    An empty ``allowed`` means unconstrained; a missing content type is refused when constrained.
    """
    patterns = [a.strip().lower() for a in allowed]
    if not patterns:
        return True
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    major = media.split("/", 1)[0]
    return any(p in (media, "*/*") or p == f"{major}/*" for p in patterns)
