"""The one URL parser, IP notations and address classes (guard.urls, guard.ipaddr)."""

from __future__ import annotations

import ipaddress

import pytest

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard import check_address, classify, is_address_allowed, mime_allowed, parse_url
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
