"""Hypothesis: the meet is exact (sound and complete), commutative, associative, idempotent.

Every check compares against reference semantics written independently of the meet: the glob
regex of ``patterns.paths``, ``HostPattern.matches`` and the NetHttpCapability docstring's rules
for empty fields, evaluated over a finite universe of concrete resources.
"""

from __future__ import annotations

import ipaddress
import itertools
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.model import Capability, NetHttpCapability
from policy_engine.patterns.host_meet import meet_hosts, simplify_hosts
from policy_engine.patterns.hosts import HostPattern
from policy_engine.patterns.meet import decompose, group, meet, meet_atom_sets
from policy_engine.patterns.path_meet import contains, disjoint, meet_globs, simplify_globs
from policy_engine.patterns.paths import PathGlob

PROPS = settings(max_examples=300, deadline=None)

# --- paths ------------------------------------------------------------------------------------

GLOB_SEGMENTS = ["a", "b", "ab", "x.py", "*", "a*", "*b", "*.py", "?", "a?", "?b", "**"]
PATH_SEGMENTS = ["a", "b", "ab", "ba", "aab", "x.py", "c"]
PATHS = ["/"] + [
    "/" + "/".join(p) for n in range(1, 5) for p in itertools.product(PATH_SEGMENTS, repeat=n)
    if n < 4 or p[0] in ("a", "x.py")  # keep the universe small but with some depth
]

globs = st.lists(st.sampled_from(GLOB_SEGMENTS), min_size=0, max_size=4).map(
    lambda segs: "/" + "/".join(segs))
paths = st.sampled_from(PATHS)


@cache
def glob_admits(glob: str, path: str) -> bool:
    return PathGlob.of(glob).matches(path)


def conj_admits(conj: tuple[str, ...], path: str) -> bool:
    return bool(conj) and all(glob_admits(g, path) for g in conj)


def admitted(conj: tuple[str, ...]) -> frozenset[str]:
    return frozenset(p for p in PATHS if conj_admits(conj, p))


@PROPS
@given(globs, globs, paths)
def test_glob_meet_is_exact_on_any_path(a: str, b: str, path: str) -> None:
    m = meet_globs(a, b)
    assert conj_admits(m, path) == (glob_admits(a, path) and glob_admits(b, path))


@PROPS
@given(globs, globs)
def test_glob_meet_is_exact_on_the_universe(a: str, b: str) -> None:
    assert admitted(meet_globs(a, b)) == admitted((a,)) & admitted((b,))


@PROPS
@given(globs, globs)
def test_glob_containment_is_sound(a: str, b: str) -> None:
    if contains(a, b):
        assert admitted((b,)) <= admitted((a,))
    if disjoint(a, b):
        assert not admitted((a,)) & admitted((b,))
    if not meet_globs(a, b):
        assert disjoint(a, b)


@PROPS
@given(globs, globs, globs)
def test_glob_meet_algebra(a: str, b: str, c: str) -> None:
    assert meet_globs(a, b) == meet_globs(b, a)  # structurally, thanks to canonical order
    assert meet_globs(a, a) == simplify_globs([a])
    assert admitted(meet_globs(a, a)) == admitted((a,))
    left = simplify_globs([*meet_globs(a, b), c]) if meet_globs(a, b) else ()
    right = simplify_globs([a, *meet_globs(b, c)]) if meet_globs(b, c) else ()
    assert admitted(left) == admitted(right) == admitted((a,)) & admitted((b,)) & admitted((c,))


# --- hosts ------------------------------------------------------------------------------------

HOST_PATTERNS = ["a.com", "b.a.com", "x.a.com", "c.b.a.com", "a.org", "*.a.com", "*.b.a.com",
                 "*.com", "*.org", "*", "10.0.0.1", "10.1.2.3", "::1", "10.0.0.0/8",
                 "10.1.0.0/16", "10.0.0.0/24", "::/0", "fe80::/10"]
HOSTS = ["a.com", "b.a.com", "x.a.com", "c.b.a.com", "z.b.a.com", "a.org", "q.a.org", "com",
         "10.0.0.1", "10.1.2.3", "10.2.0.5", "192.168.1.1", "::1", "fe80::1"]
hosts = st.sampled_from(HOST_PATTERNS)


def host_admits(pattern: str, host: str) -> bool:
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    return HostPattern.of(pattern).matches(host, ip)


def hosts_admitted(conj: tuple[str, ...]) -> frozenset[str]:
    return frozenset(h for h in HOSTS if conj and all(host_admits(p, h) for p in conj))


@PROPS
@given(hosts, hosts, hosts)
def test_host_meet_is_exact_and_algebraic(a: str, b: str, c: str) -> None:
    m = meet_hosts(a, b)
    assert hosts_admitted(m) == hosts_admitted((a,)) & hosts_admitted((b,))
    assert m == meet_hosts(b, a)
    assert meet_hosts(a, a) == simplify_hosts([a])
    left = simplify_hosts([*m, c]) if m else ()
    right = simplify_hosts([a, *meet_hosts(b, c)]) if meet_hosts(b, c) else ()
    assert hosts_admitted(left) == hosts_admitted(right)


# --- HTTP capabilities ------------------------------------------------------------------------

DEFAULT_PORT = {"http": 80, "https": 443}
Resource = tuple[str, str, int, str, str]
RESOURCES: list[Resource] = list(itertools.product(
    ["http", "https"], ["a.com", "b.a.com", "x.a.com", "10.0.0.1", "10.1.2.3"], [80, 443, 8080],
    ["GET", "HEAD", "POST"], ["application/json", "text/html", "image/png"]))


def subsets(values: list[str] | list[int]) -> st.SearchStrategy[tuple[object, ...]]:
    return st.lists(st.sampled_from(values), unique=True, max_size=len(values)).map(tuple)


http_caps = st.builds(
    NetHttpCapability,
    hosts=st.lists(hosts, min_size=1, max_size=2, unique=True).map(tuple),
    ports=subsets([80, 443, 8080]),
    schemes=subsets(["http", "https"]),
    methods=subsets(["GET", "HEAD", "POST"]),
    mime=subsets(["application/json", "text/*", "*/*", "text/html"]),
)


def http_admits(cap: Capability, r: Resource) -> bool:
    """The NetHttpCapability docstring, literally: empty fields take their defaults."""
    assert isinstance(cap, NetHttpCapability)
    scheme, host, port, method, mime = r
    return (
        any(host_admits(h, host) for h in cap.hosts)
        and scheme in (cap.schemes or ("https",))
        and (port in cap.ports if cap.ports else port == DEFAULT_PORT[scheme])
        and method in (cap.methods or ("GET", "HEAD"))
        and (not cap.mime or any(
            m in ("*/*", mime) or (m.endswith("/*") and mime.startswith(m[:-1]))
            for m in cap.mime))
    )


def dnf_admitted(dnf: tuple[tuple[Capability, ...], ...]) -> frozenset[Resource]:
    return frozenset(r for r in RESOURCES if any(all(http_admits(c, r) for c in conj)
                                                 for conj in dnf))


@PROPS
@given(http_caps, http_caps)
def test_http_meet_is_exact_and_commutative(a: NetHttpCapability, b: NetHttpCapability) -> None:
    ab = meet(a, b)
    assert dnf_admitted(ab) == dnf_admitted(((a,),)) & dnf_admitted(((b,),))
    assert dnf_admitted(ab) == dnf_admitted(meet(b, a))
    assert dnf_admitted(meet(a, a)) == dnf_admitted(((a,),))


@PROPS
@given(http_caps, http_caps, http_caps)
def test_http_meet_is_associative(
    a: NetHttpCapability, b: NetHttpCapability, c: NetHttpCapability
) -> None:
    want = dnf_admitted(((a,),)) & dnf_admitted(((b,),)) & dnf_admitted(((c,),))
    da, db, dc = decompose(a), decompose(b), decompose(c)
    assert dnf_admitted(group(meet_atom_sets(meet_atom_sets(da, db), dc))) == want
    assert dnf_admitted(group(meet_atom_sets(da, meet_atom_sets(db, dc)))) == want
