"""The one URL parser, IP notations and address classes (guard.urls, guard.ipaddr)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard import check_address, classify, is_address_allowed, mime_allowed, parse_url
from policy_engine.guard.ipaddr import _RANGES, METADATA_ADDRESSES, parse_ipv4, parse_ipv4_parts
from policy_engine.guard.urls import ParsedUrl, parse_fast, parse_full
from policy_engine.patterns import HostPattern

LOOPBACK_FORMS = [
    "127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "0177.0.0.01", "127.1", "127.0.1",
    "0x7f.1", "0x7F.0.0.1", "017700000001", "[::1]", "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]", "[0:0:0:0:0:ffff:127.0.0.1]", "[::127.0.0.1]", "[64:ff9b::127.0.0.1]",
    "[2002:7f00:1::]", "127.000.000.001",
]
METADATA_FORMS = [
    "169.254.169.254", "2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "169.254.43518",
    "0xa9.0xfe.0xa9.0xfe", "[::ffff:169.254.169.254]", "[::ffff:a9fe:a9fe]", "[fd00:ec2::254]",
    "100.100.100.200",
]


@pytest.mark.parametrize("host", LOOPBACK_FORMS + METADATA_FORMS)
def test_every_ip_notation_is_normalized_and_refused_unless_named(host: str) -> None:
    u = parse_url(f"http://{host}/x")
    assert u.ip is not None
    cls = classify(u.ip)
    assert cls in ("loopback", "metadata"), (host, u.ip, cls)
    assert not is_address_allowed(u.host, u.ip, [HostPattern.of("*")])
    assert not is_address_allowed(u.host, u.ip, [HostPattern.of("*.com")])
    named = "127.0.0.1" if cls == "loopback" and (u.ip.version == 4 or u.ip.ipv4_mapped) \
        else None
    if named is not None:
        assert is_address_allowed(u.host, u.ip, [HostPattern.of(named)])
    with pytest.raises(PolicyEngineError) as exc:
        check_address(u.host, u.ip, ["api.github.com"])
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED


@pytest.mark.parametrize(("host", "want"), [
    ("2130706433", "127.0.0.1"), ("0x7f000001", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"),
    ("127.1", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
    ("[::1]", "::1"), ("[0:0::1]", "::1"), ("example.com.", "example.com"),
])
def test_ip_literals_canonical_host(host: str, want: str) -> None:
    assert parse_url(f"https://{host}/").host == want


@pytest.mark.parametrize(("ip", "want"), [
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "private"), ("fc00::1", "private"), ("fe80::1", "link-local"),
    ("169.254.1.1", "link-local"), ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"), ("::ffff:10.0.0.1", "private"),
    ("2002:0a00:0001::", "private"), ("64:ff9b::a9fe:a9fe", "metadata"),
    ("168.63.129.16", "metadata"), ("8.8.8.8", None), ("2606:4700:4700::1111", None),
    ("140.82.112.3", None),
])
def test_classify(ip: str, want: str | None) -> None:
    assert classify(ipaddress.ip_address(ip)) == want


def test_private_address_allowed_only_when_named_explicitly() -> None:
    ip = ipaddress.ip_address("10.0.0.5")
    assert is_address_allowed("10.0.0.5", ip, ["10.0.0.0/8"])
    assert is_address_allowed("10.0.0.5", ip, [HostPattern.of("10.0.0.5")])
    assert is_address_allowed("db.internal", ip, ["db.internal"])
    assert not is_address_allowed("db.internal", ip, ["*.internal"])
    assert not is_address_allowed("10.0.0.5", ip, ["*"])
    assert is_address_allowed("example.com", ipaddress.ip_address("93.184.216.34"), [])


@pytest.mark.parametrize("url", [
    "http://user:pass@host/", "http://user@host/", "http://evil.com\\@good.com/",
    "http://good.com\\evil.com", "http://a b.com/", "http://a.com/ x", "http://a.com/\tx",
    "http://a.com/\x00", "http://a.com\u200b/", "http://a.com/\u00a0", "file:///etc/passwd",
    "ftp://a.com/", "javascript:alert(1)", "http://%31%32%37.0.0.1/", "http://ex%61mple.com/",
    "http://[::1%25eth0]/", "http://1.2.3.4.5/", "http://foo.09/", "http://0x/",
    "http://256.0.0.1/", "http://a..b/", "http://a_b!.com/", "http://-a.com/",
    "http://xn--a.com/", "http://[::1/", "http://exa mple.com/", "http://127.0.0.1./",
    "http://169.254.169.254./", "http://0x7f.1./",
])
def test_refused_urls_are_blocked(url: str) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        parse_url(url)
    assert exc.value.code in (ErrorCode.CAPABILITY_BLOCKED, ErrorCode.SCHEMA_VALIDATION_FAILED)
    assert exc.value.reason == exc.value.reason.strip()
    assert exc.value.reason[0].islower()


@pytest.mark.parametrize("url", [
    "/relative", "example.com/x", "http:/example.com/", "http:///example.com/", "http:example.com",
    "http://", "http://:80/", "http://a.com:99999/", "http://a.com:8_0/", "http://a.com:x/", "",
])
def test_unparseable_urls_are_validation_failures(url: str) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        parse_url(url)
    assert exc.value.code is ErrorCode.SCHEMA_VALIDATION_FAILED


def test_backslash_and_userinfo_are_capability_blocked() -> None:
    for url in ("http://user:pass@host/", "http://evil.com\\@good.com/", "http://good.com\\x"):
        with pytest.raises(PolicyEngineError) as exc:
            parse_url(url)
        assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED


def test_fields_and_canonical_form() -> None:
    u = parse_url("HTTPS://API.GitHub.com.:443/a/./b/../c?q=1#frag")
    assert (u.scheme, u.host, u.port, u.explicit_port) == ("https", "api.github.com", 443, False)
    assert (u.path, u.query, u.ip) == ("/a/c", "q=1", None)
    assert u.url == "https://api.github.com/a/c?q=1"
    v = parse_url("http://example.com:8080")
    assert (v.port, v.explicit_port, v.path, v.query) == (8080, True, "/", None)
    assert v.url == "http://example.com:8080/"
    assert parse_url("http://[::1]:81/").netloc == "[::1]:81"


def test_idna_hosts_are_encoded() -> None:
    assert parse_url("https://bücher.example/").host == "xn--bcher-kva.example"
    assert parse_url("https://xn--bcher-kva.example/").host == "xn--bcher-kva.example"
    assert parse_url("https://ＥＸＡＭＰＬＥ.com/").host == "example.com"
    assert parse_url("http://１２７.０.０.１/").host == "127.0.0.1"


def test_other_schemes_only_when_asked() -> None:
    assert parse_url("wss://chat.example/", schemes=["wss"]).port == 443
    with pytest.raises(PolicyEngineError):
        parse_url("wss://chat.example/")
    with pytest.raises(PolicyEngineError) as exc:
        parse_url("custom://a.com/", schemes=["custom"])
    assert "explicit port" in exc.value.reason


def test_mime_allowed() -> None:
    assert mime_allowed("application/json; charset=utf-8", ["application/json"])
    assert mime_allowed("text/html", ["text/*"])
    assert mime_allowed("image/png", [])
    assert not mime_allowed("text/html", ["application/json"])
    assert not mime_allowed(None, ["application/json"])
    assert mime_allowed("Application/JSON", ["application/json"])


# --- the fast path ------------------------------------------------------------------------------

_SAFE = "abcz019-._~!$&'()*+,;=:/"
_NASTY = "ABZ%@#?\\ \t\x00\u00e9\u200b.[]:/-_0x"
canonical_labels = st.text(alphabet="abcz0129_-AZ", min_size=1, max_size=10)
canonical = st.builds(
    lambda scheme, ls, last, dot, port, path, query: (
        f"{scheme}://{'.'.join([*ls, last])}{dot}{'' if port is None else ':' + port}{path}"
        f"{'' if query is None else '?' + query}"),
    st.sampled_from(["http", "https"]),
    st.lists(canonical_labels, max_size=3),
    st.text(alphabet="abczAZ", min_size=1, max_size=3) | st.sampled_from(
        ["com", "io", "a-", "b_", "XN--bcher-kva", "xn--a"]),
    st.sampled_from(["", "", "."]),
    st.none() | st.text(alphabet="0123456789", min_size=1, max_size=6),
    st.text(alphabet=_SAFE, max_size=24).map(lambda p: p if not p else "/" + p),
    st.none() | st.text(alphabet=_SAFE + "?", max_size=12),
)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A canonical-looking URL with a few characters inserted, replaced or dropped."""
    url = draw(canonical)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(url)))
        op = draw(st.sampled_from(["insert", "replace", "drop"]))
        ch = draw(st.sampled_from(_NASTY))
        if op == "insert":
            url = url[:i] + ch + url[i:]
        elif op == "replace":
            url = url[:i] + ch + url[i + 1:]
        else:
            url = url[:i] + url[i + 1:]
    return url


octets = st.integers(0, 300).map(str) | st.sampled_from(["0", "00", "01", "0x7f", "255", "256"])
dotted = st.lists(octets, min_size=1, max_size=5).map(".".join)
wild_hosts = dotted | st.sampled_from(["127.0.0.1", "[::1]", "a" * 250 + ".com",
                                       ".".join(["abc"] * 64), "xn--bcher-kva.example",
                                       "xn--a.com", "0x7f", "a.09", "a" * 64,
                                       "example.com.", "u:p@host", "%61.com", "EXAMPLE.com"])
wild = st.builds(lambda scheme, host, path: f"{scheme}://{host}{path}",
                 st.sampled_from(["http", "https", "HTTPS", "ftp", "ws"]), wild_hosts,
                 st.sampled_from(["", "/", "/a/./b", "/a/../b", "/.well-known/x", "/%2e%2e/x",
                                  "/a/b.", "/.", "/a#f", "?q"]))
urls = canonical | mutated() | wild


def _full(url: str) -> ParsedUrl | str:
    try:
        return parse_full(url)
    except PolicyEngineError as exc:
        return f"refused: {exc.code}"


@settings(max_examples=3000, deadline=None)
@given(urls)
def test_fast_path_agrees_with_the_full_parser(url: str) -> None:
    fast = parse_fast(url)
    if fast is not None:
        full = _full(url)
        assert fast == full, url
        assert (hash(fast), repr(fast), fast.url) == (hash(full), repr(full), full.url)
        assert parse_url(url) == fast


@pytest.mark.parametrize("url", [
    "https://api.github.com/repos/x/y", "http://a.b-c.example:8080/p?q=1&r=a/b",
    "https://example.com", "https://example.com?x", "https://example.com:443/",
    "http://example.com:0080/", "https://a_b.example.com/x:y", "https://x.io/a;b=c,d+e",
    "http://127.0.0.1:8080/", "https://169.254.169.254/latest/meta-data", "http://0.0.0.0/",
    "http://255.255.255.255/", "https://API.GitHub.com./x", "https://example.com./",
])
def test_fast_path_takes_the_common_urls(url: str) -> None:
    fast = parse_fast(url)
    assert fast is not None
    assert fast == parse_full(url)


@pytest.mark.parametrize("url", [
    "https://127.1/", "https://0177.0.0.1/", "HTTPS://a.com/", "https://example.com../",
    "https://127.0.0.01/", "https://256.0.0.1/", "https://1.2.3.4.5/", "https://127.0.0.1./",
    "https://xn--bcher-kva.example/", "https://a.com/./x", "https://a.com/%2e%2e/x",
    "https://u@a.com/", "https://a.com/#frag", "https://a.com:99999/", "https://a.com:0/",
    "https://0x7f/", "https://a.09/", "wss://a.com/", "https://a.com/é",
])
def test_fast_path_leaves_the_rest_to_the_full_parser(url: str) -> None:
    assert parse_fast(url) is None


@settings(max_examples=1000, deadline=None)
@given(dotted)
def test_dotted_decimal_shortcut_agrees_with_every_notation(host: str) -> None:
    try:
        want: object = parse_ipv4_parts(host)
    except ValueError:
        want = ValueError
    try:
        got: object = parse_ipv4(host)
    except ValueError:
        got = ValueError
    assert got == want


def _classify_by_networks(ip: ipaddress.IPv4Address) -> str | None:
    """classify() as it reads without the integer table: the ranges in order, then the stdlib."""
    if ip in METADATA_ADDRESSES:
        return "metadata"
    for net, cls in _RANGES:
        if ip.version == net.version and ip in net:
            return cls
    if ip.is_reserved or ip.is_private or not ip.is_global:
        return "reserved"
    return None


@settings(max_examples=3000, deadline=None)
@given(st.integers(0, 2**32 - 1) | st.sampled_from([
    0, 2**32 - 1, 0x7F000001, 0xA9FEA9FE, 0x0A000000, 0x0AFFFFFF, 0xAC100000, 0xAC1FFFFF,
    0xC0A80000, 0x64400000, 0x647FFFFF, 0xE0000000, 0xF0000000, 0xC0000000, 0xC00000FF,
    0xC0000200, 0xC6120000, 0xC6336400, 0xCB007100, 0x08080808]))
def test_ipv4_classes_by_integer_mask(value: int) -> None:
    ip = ipaddress.IPv4Address(value)
    assert classify(ip) == _classify_by_networks(ip)
