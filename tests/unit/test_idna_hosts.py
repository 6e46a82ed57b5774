"""One UTS-46 mapping (non-transitional, the ``idna`` package) for host patterns, URLs and the
browser's rules: a pattern and a URL naming the same host agree on its ASCII form (REPRO F9).

Python's ``"idna"`` codec is IDNA 2003 (transitional: ``ß`` → ``ss``, ``ς`` → ``σ``, ZWJ
dropped), which WHATWG URL and httpx do not use: ``forbid hosts ["*.faß.de"]`` used to deny
``www.fass.de`` and allow ``https://www.faß.de/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.executor_browser.rules import RequestRules
from policy_engine.compiler import compile_files
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.explain import ExplainRequest, explain
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.guard.urls import parse_url
from policy_engine.model import BrowserCapability, Grant, Manifest, NetHttpCapability, NetHttpOp
from policy_engine.patterns import HostPattern, canonical_hostname, validate_host_pattern
from policy_engine.patterns.host_meet import meet_hosts
from policy_engine.profile import ProfileBuilder

FAR = 4_102_444_800_000
FULLWIDTH_DOT, IDEOGRAPHIC_DOT, HALFWIDTH_DOT = "\uff0e", "\u3002", "\uff61"
ZWJ, ZWNJ = "\u200d", "\u200c"
CYRILLIC_A = "\u0430"

# host as written -> its one ASCII form (UTS-46 non-transitional, lowercase)
SAME_HOST = [
    ("faß.de", "xn--fa-hia.de"),
    ("www.faß.de", "www.xn--fa-hia.de"),
    ("WWW.FAß.DE", "www.xn--fa-hia.de"),
    ("\uff26\uff21ß.de", "xn--fa-hia.de"),  # full-width letters fold
    (f"www{FULLWIDTH_DOT}faß{IDEOGRAPHIC_DOT}de", "www.xn--fa-hia.de"),
    (f"a{HALFWIDTH_DOT}faß.de", "a.xn--fa-hia.de"),
    ("ας.gr", "xn--mxa8a.gr"),  # final sigma kept (transitional would give σ)
    ("ασ.gr", "xn--mxa0b.gr"),
    (f"p{CYRILLIC_A}ypal.com", "xn--pypal-4ve.com"),  # mixed scripts: one label, one form
    ("bücher.example", "xn--bcher-kva.example"),
    ("xn--fa-hia.de", "xn--fa-hia.de"),
    ("fass.de", "fass.de"),
]


@pytest.mark.parametrize(("written", "ascii_form"), SAME_HOST)
def test_pattern_and_url_map_a_host_to_the_same_ascii_form(written: str, ascii_form: str) -> None:
    assert HostPattern.of(written).value == ascii_form
    assert HostPattern.of("*." + written).value == ascii_form
    assert canonical_hostname(written) == ascii_form
    assert parse_url(f"https://{written}/").host == ascii_form


def test_sharp_s_and_final_sigma_are_not_folded_into_ss_and_sigma() -> None:
    assert HostPattern.of("faß.de").value != HostPattern.of("fass.de").value
    assert HostPattern.of("ας.gr").value != HostPattern.of("ασ.gr").value
    assert not HostPattern.of("*.faß.de").matches("www.fass.de")
    assert HostPattern.of("*.faß.de").matches(parse_url("https://www.faß.de/").host)
    assert meet_hosts("*.faß.de", "www.fass.de") == ()
    assert meet_hosts("*.faß.de", "www.faß.de") == ("www.xn--fa-hia.de",)


@pytest.mark.parametrize("pattern", [
    f"a{ZWJ}b.example",  # a joiner outside its CONTEXTJ context: IDNA 2008 refuses it
    f"a{ZWNJ}b.example",
    f"\u0915\u094d{ZWJ}\u0937.example",  # valid CONTEXTJ, but invisible: URLs refuse it too
    "ab\u00ad.example",  # soft hyphen: invisible, mapped away by UTS-46
    "faß..de",
    "xn--zz-zzz-invalid.de",  # not valid punycode
])
def test_invisible_or_invalid_international_patterns_are_refused(pattern: str) -> None:
    problem = validate_host_pattern(pattern)
    assert problem is not None
    if not pattern.isascii() and ".." not in pattern:  # the hidden code point is named
        assert "U+" in problem, problem
    with pytest.raises(PolicyEngineError) as info:
        parse_url(f"https://{pattern}/")
    assert info.value.code is ErrorCode.CAPABILITY_BLOCKED


def compile_text(tmp_path: Path, text: str) -> PolicySet:
    path = tmp_path / "p.sbpolicy"
    path.write_text('policy "t" version "1.0.0"\n' + text)
    return compile_files([path])


POLICY = (
    'permit "web" net.http, browser.use hosts ["*"] schemes ["https"]\n'
    'forbid "no-fass" net.http, browser.use hosts ["*.faß.de", "ας.gr", '
    f'"p{CYRILLIC_A}ypal.com"]\n'
)
DENIED = ["https://www.faß.de/", f"https://www{FULLWIDTH_DOT}faß{IDEOGRAPHIC_DOT}de/",
          "https://WWW.FAß.DE/", "https://www.xn--fa-hia.de/", "https://ας.gr/",
          f"https://p{CYRILLIC_A}ypal.com/"]
ALLOWED = ["https://www.fass.de/", "https://ασ.gr/", "https://paypal.com/"]


def fetch_call() -> tuple[Manifest, Grant]:
    net = NetHttpCapability(hosts=("*",), schemes=("https",), methods=("GET",))
    manifest = Manifest(name="fetch", version="1", permissions=(net,), network="on")
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="fetch", call_id="c",
                  capabilities=(net,), expires_at=FAR)
    return manifest, grant


@pytest.mark.parametrize("url", DENIED + ALLOWED)
def test_guard_and_explain_apply_the_forbid_to_the_host_the_url_names(
    tmp_path: Path, url: str,
) -> None:
    ps = compile_text(tmp_path, POLICY)
    manifest, grant = fetch_call()
    profile = ProfileBuilder(ps).build(grant, manifest)
    decision = Guard(ps).decide(profile, NetHttpOp(url=url))
    dry = explain(ps, manifest, grant,
                  ExplainRequest.model_validate({"op": NetHttpOp(url=url)})).decision
    assert (decision.decision, dry.decision) == (("deny",) * 2 if url in DENIED else ("allow",) * 2)
    if url in DENIED:
        assert decision.rule is not None
        assert decision.rule.id == "no-fass"


@pytest.mark.parametrize("url", DENIED)
def test_browser_rules_apply_the_forbid_to_every_request(tmp_path: Path, url: str) -> None:
    ps = compile_text(tmp_path, POLICY)
    cap = BrowserCapability(hosts=("*",), scopes=("open",), schemes=("https",))
    manifest = Manifest(name="fetch", version="1", permissions=(cap,), network="on")
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="fetch", call_id="c",
                  capabilities=(cap,), expires_at=FAR)
    profile = ProfileBuilder(ps).build(grant, manifest)
    with pytest.raises(PolicyEngineError) as info:  # decided before any name is resolved
        RequestRules(Guard(ps)).check(profile, url)
    assert info.value.code is ErrorCode.CAPABILITY_BLOCKED


def test_cli_explain_denies_the_international_spelling(tmp_path: Path) -> None:
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "t" version "1.0.0"\n' + POLICY, encoding="utf-8")
    manifest, grant = fetch_call()
    (tmp_path / "m.json").write_text(manifest.model_dump_json())
    (tmp_path / "g.json").write_text(grant.model_dump_json())
    answers = {}
    for url in ("https://www.faß.de/", "https://www.fass.de/"):
        req = tmp_path / "r.json"
        req.write_text(json.dumps({"op": {"kind": "net.http", "method": "GET", "url": url}}),
                       encoding="utf-8")
        run = subprocess.run(
            [sys.executable, "-m", "policy_engine.cli", "explain", "--policy", str(policy),
             "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
             "--request", str(req), "--format", "json"],
            capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ))
        assert run.returncode == 0, run.stderr
        answers[url] = json.loads(run.stdout)["decision"]
    assert answers == {"https://www.faß.de/": "deny", "https://www.fass.de/": "allow"}


def test_a_pattern_that_maps_to_an_ip_address_is_that_address() -> None:
    """Full-width digits fold to ASCII: the pattern is the IP literal URLs read, not a name."""
    written = "\uff11\uff12\uff17.\uff10.\uff10.\uff11"  # １２７.０.０.１
    hp = HostPattern.of(written)
    assert (hp.kind, hp.value) == ("ip", "127.0.0.1")
    u = parse_url(f"http://{written}/")
    assert u.ip is not None
    assert hp.matches(u.host, u.ip)


@pytest.mark.parametrize("pattern", ["0x7f.1", "127.1", "2130706433", "*.1.2.3", "a.0x10"])
def test_a_pattern_ending_in_a_number_must_be_a_dotted_address(pattern: str) -> None:
    # URLs read such hosts as IPv4 addresses (WHATWG), so as a name the pattern never matches
    problem = validate_host_pattern(pattern)
    assert problem is not None
    assert "number" in problem
