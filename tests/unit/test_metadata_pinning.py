"""Which addresses a vetted name may resolve to (REPRO F10, DNS rebinding).

A rule naming a host exactly used to let it resolve to anything, metadata addresses included.
Now: metadata addresses only as an IP literal a rule names itself, never through a name; a name
the allowing rule names exactly may reach loopback and private addresses only; an answer mixing
public and non-public addresses is refused whoever names what. Checked on ``pin`` (the net.http
executor and the restricted proxy), on the browser's request rules, and end to end with a real
DNS server on a loopback port (``loopback_dns``): no packet leaves loopback.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plugins.executor_browser.rules import RequestRules
from plugins.executor_http import HttpExecutor
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard.ipaddr import METADATA_ADDRESSES, classify, is_address_allowed
from policy_engine.model import BrowserCapability, NetHttpCapability, NetHttpOp, SideEffect
from policy_engine.netproxy.resolve import IPAddress, pin
from policy_engine.patterns import HostPattern
from tests.integration.servers import LoopbackServer, compiled_profile, send
from tests.unit.loopback_dns import LoopbackDns

DOCUMENTED_METADATA = [
    "169.254.169.254", "169.254.170.2", "169.254.170.23", "100.100.100.200", "168.63.129.16",
    "192.0.0.192", "fd00:ec2::254", "fd00:ec2::23", "fe80::a9fe:a9fe", "fd20:ce::254",
]


def answers(*ips: str) -> Callable[[str, int], list[IPAddress]]:
    return lambda _host, _port: [ipaddress.ip_address(a) for a in ips]


def never(_host: str, _port: int) -> list[IPAddress]:
    raise AssertionError("an IP literal is never resolved")


def pats(*texts: str) -> tuple[HostPattern, ...]:
    return tuple(HostPattern.of(t) for t in texts)


def refused(fn: Callable[[], object]) -> PolicyEngineError:
    with pytest.raises(PolicyEngineError) as info:
        fn()
    assert info.value.code is ErrorCode.CAPABILITY_BLOCKED
    return info.value


@pytest.mark.parametrize("ip", DOCUMENTED_METADATA)
def test_documented_metadata_addresses_are_classified_metadata(ip: str) -> None:
    assert ipaddress.ip_address(ip) in METADATA_ADDRESSES
    assert classify(ip) == "metadata"
    assert classify(f"::ffff:{ip}" if "." in ip else ip) == "metadata"


@pytest.mark.parametrize("ip", DOCUMENTED_METADATA)
def test_an_exactly_named_host_never_resolves_to_a_metadata_address(ip: str) -> None:
    err = refused(lambda: pin("api.github.com", 443, None, pats("api.github.com"),
                              answers(ip)))
    assert "metadata" in err.reason
    # not even when the rule also names the address: a name is not the literal
    refused(lambda: pin("api.github.com", 443, None, pats("api.github.com", ip), answers(ip)))
    mapped = f"::ffff:{ip}" if "." in ip else ip
    refused(lambda: pin("api.github.com", 443, None, pats("api.github.com"), answers(mapped)))


@pytest.mark.parametrize("ip", ["169.254.169.254", "fd00:ec2::254", "100.100.100.200"])
def test_a_metadata_literal_is_reachable_only_when_a_rule_names_that_address(ip: str) -> None:
    addr = ipaddress.ip_address(ip)
    host = str(addr)
    assert pin(host, 80, addr, pats(ip), never).addresses == (addr,)
    for other in ("*", "169.254.0.0/16", "fd00:ec2::/32", "100.64.0.0/10", "api.github.com"):
        refused(lambda other=other: pin(host, 80, addr, pats(other), never))  # type: ignore[misc]


@pytest.mark.parametrize("answer", [
    ("10.0.0.5", "93.184.216.34"), ("93.184.216.34", "127.0.0.1"),
    ("2606:4700::1", "fc00::5"), ("127.0.0.1", "2606:4700::1"),
])
def test_an_answer_mixing_public_and_private_addresses_is_refused(
    answer: tuple[str, ...],
) -> None:
    private = next(a for a in answer if classify(a) is not None)
    err = refused(lambda: pin("db.internal", 80, None, pats("db.internal", private),
                              answers(*answer)))
    assert "public and non-public" in err.reason


@pytest.mark.parametrize(("ip", "ok"), [
    ("10.0.0.5", True), ("127.0.0.1", True), ("::1", True), ("192.168.1.9", True),
    ("fc00::9", True), ("169.254.1.1", False), ("fe80::1", False), ("0.0.0.0", False),
    ("::", False), ("224.0.0.1", False), ("240.0.0.1", False),
])
def test_a_name_the_rule_names_exactly_reaches_loopback_and_private_only(
    ip: str, ok: bool,
) -> None:
    addr = ipaddress.ip_address(ip)
    assert is_address_allowed("db.internal", addr, pats("db.internal")) is ok
    assert not is_address_allowed("db.internal", addr, pats("*.internal"))
    assert not is_address_allowed("db.internal", addr, pats("*"))
    # the literal itself stays reachable when a rule names it (link-local included)
    if classify(addr) != "metadata":
        assert is_address_allowed(str(addr), addr, pats(str(addr)))


ROUTES = {"/ok": lambda h: send(h, 200, "text/plain", b"named loopback host")}
ZONE = {
    "svc.test": ["127.0.0.1"],
    "meta.test": ["169.254.169.254"],
    "v6meta.test": ["fd00:ec2::254"],
    "alibaba.test": ["100.100.100.200"],
    "mixed.test": ["127.0.0.1", "93.184.216.34"],
    "linklocal.test": ["169.254.7.7"],
}
NAMES = tuple(ZONE)


@pytest.fixture
def dns() -> Iterator[LoopbackDns]:
    with LoopbackDns(ZONE) as server:
        yield server


def test_http_executor_over_real_dns_reaches_the_named_loopback_host_only(
    tmp_path: Path, dns: LoopbackDns,
) -> None:
    with LoopbackServer(ROUTES) as srv:
        hosts = ", ".join(f'"{n}"' for n in NAMES)
        rules = (f'permit "named" net.http hosts [{hosts}] schemes ["http"] '
                 f"ports [{srv.port}] methods [\"GET\"]")
        cap = NetHttpCapability(hosts=NAMES, schemes=("http",), ports=(srv.port,),
                                methods=("GET",))
        profile, guard = compiled_profile(tmp_path, rules, (cap,))
        ex = HttpExecutor(guard, resolver=dns.resolve)
        try:
            ctx = ExecContext(profile=profile, deadline=time.monotonic() + 30, guard=guard)
            res = ex.execute(ctx, NetHttpOp(url=f"http://svc.test:{srv.port}/ok"))
            assert res.out["status"] == 200
            for name in NAMES[1:]:
                ctx = ExecContext(profile=profile, deadline=time.monotonic() + 30, guard=guard)
                refused(lambda name=name, ctx=ctx: ex.execute(  # type: ignore[misc]
                    ctx, NetHttpOp(url=f"http://{name}:{srv.port}/ok")))
                [rec] = [e.meta for e in ctx.side_effects if e.kind is SideEffect.NETWORK]
                assert rec["refused"] == ErrorCode.CAPABILITY_BLOCKED.value
                assert "address" not in rec  # nothing was dialed
        finally:
            ex.close()
        assert [p for _m, p, _h in srv.seen.requests] == ["/ok"]
    assert {q.lower() for q in dns.queries} == set(NAMES)  # real DNS answered every name


def test_browser_rules_over_real_dns_refuse_metadata_and_mixed_answers(
    tmp_path: Path, dns: LoopbackDns,
) -> None:
    hosts = ", ".join(f'"{n}"' for n in NAMES)
    rules = f'permit "named" browser.use hosts [{hosts}] scopes [open] schemes ["https"]'
    cap = BrowserCapability(hosts=NAMES, scopes=("open",), schemes=("https",))
    profile, guard = compiled_profile(tmp_path, rules, (cap,), tool="browse")
    gate = RequestRules(guard, resolver=dns.resolve)
    assert gate.check(profile, "https://svc.test/").host == "svc.test"
    for name in NAMES[1:]:
        err = refused(lambda name=name: gate.check(profile, f"https://{name}/"))  # type: ignore[misc]
        assert name in err.reason
