"""The meet of patterns and capabilities: DESIGN.md §2 examples, disjointness, defaults."""

from __future__ import annotations

import pytest

from policy_engine.model import (
    ArgAlternative,
    ArgSlot,
    BrowserCapability,
    BrowserScope,
    FsCapability,
    GpuCapability,
    NetHttpCapability,
    ProcCapability,
    TmpCapability,
)
from policy_engine.patterns.host_meet import host_contains, meet_hosts, simplify_hosts
from policy_engine.patterns.meet import meet, meet_mime, meet_ports
from policy_engine.patterns.path_meet import contains, disjoint, meet_globs, simplify_globs


@pytest.mark.parametrize(("a", "b", "want"), [
    ("/workspace/**", "/workspace/work/**", ("/workspace/work/**",)),
    ("/a/**", "/b/**", ()),
    ("/a/**", "/a/**", ("/a/**",)),
    ("/a/**", "/a", ("/a",)),
    ("/*/x", "/a/*", ("/a/x",)),
    ("/a?c/**", "/ab?/**", ("/abc/**",)),
    ("/a/**", "/*/*/*", ("/a/*/*",)),
    ("/**", "/", ("/",)),
    ("/*", "/", ("/",)),  # the glob `/*` admits the root path too (one empty segment)
    ("/a", "/b", ()),
    ("/a/*.py", "/a/*.txt", ()),
    ("/workspace/**", "/**/.env", ("/**/.env", "/workspace/**")),  # no one glob says it
    ("/a*/**", "/*b/**", ("/*b/**", "/a*/**")),
])
def test_glob_meet(a: str, b: str, want: tuple[str, ...]) -> None:
    assert meet_globs(a, b) == want
    assert meet_globs(b, a) == want


def test_glob_meet_is_canonical() -> None:
    assert meet_globs("/a//b/**/**", "/a/b/**") == ("/a/b/**",)


@pytest.mark.parametrize(("a", "b", "want"), [
    ("/workspace/**", "/workspace/work/**", True),
    ("/workspace/work/**", "/workspace/**", False),
    ("/workspace/**", "/workspace", True),
    ("/workspace/**", "/workspace-evil/**", False),
    ("/**", "/", True),
    ("/a/*", "/a/b?", True),
    ("/a/b?", "/a/*", False),
    ("/**/.env", "/x/**/.env", True),
    ("/a/*/c", "/a/**/c", False),
])
def test_glob_containment(a: str, b: str, want: bool) -> None:
    assert contains(a, b) is want


def test_glob_disjointness() -> None:
    assert disjoint("/a/**", "/b/**")
    assert disjoint("/a/*", "/a/*/*")
    assert not disjoint("/**", "/a")
    assert not disjoint("/*", "/**/x")
    assert not disjoint("/*", "/")


def test_conjunctions_fold_and_collapse() -> None:
    assert simplify_globs(["/w/**", "/w/x/**", "/**"]) == ("/w/x/**",)
    assert simplify_globs(["/w/**", "/**/.env", "/v/**"]) == ()
    assert simplify_globs(["/w/**", "/**/.env"]) == ("/**/.env", "/w/**")


@pytest.mark.parametrize(("a", "b", "want"), [
    ("*.github.com", "api.github.com", ("api.github.com",)),
    ("API.GitHub.com.", "api.github.com", ("api.github.com",)),
    ("a.com", "b.com", ()),
    ("*.a.com", "*.b.a.com", ("*.b.a.com",)),
    ("*.a.com", "*.b.com", ()),
    ("*.github.com", "github.com", ()),  # `*.x` needs at least one more label
    ("*", "x.com", ("x.com",)),
    ("10.0.0.0/8", "10.1.0.0/16", ("10.1.0.0/16",)),
    ("10.0.0.0/16", "10.1.0.0/16", ()),
    ("10.0.0.0/8", "10.2.3.4", ("10.2.3.4",)),
    ("::/0", "10.0.0.0/8", ()),
    ("*.a.com", "10.0.0.1", ("*.a.com", "10.0.0.1")),  # name vs address: kept, never ∅
])
def test_host_meet(a: str, b: str, want: tuple[str, ...]) -> None:
    assert meet_hosts(a, b) == want
    assert meet_hosts(b, a) == want


def test_host_containment_and_conjunction() -> None:
    assert host_contains("*.github.com", "api.github.com")
    assert not host_contains("api.github.com", "*.github.com")
    assert simplify_hosts(["*", "*.a.com", "x.a.com"]) == ("x.a.com",)


def test_port_and_mime_sets_with_defaults() -> None:
    assert meet_ports((), (), ("https",)) == ((), ("https",))
    assert meet_ports((443, 8443), (443, 80), ("https",)) == ((443,), ("https",))
    assert meet_ports((80, 8080), (8443,), ("http",)) is None
    assert meet_ports((), (443, 8443), ("https",)) == ((443,), ("https",))
    assert meet_ports((), (80, 443), ("http", "https")) == ((), ("http", "https"))
    assert meet_ports((), (80,), ("http", "https")) == ((80,), ("http",))
    assert meet_ports((), (8080,), ("http", "https")) is None
    assert meet_mime((), ("application/json",)) == ("application/json",)
    assert meet_mime(("text/*",), ("text/html", "image/png")) == ("text/html",)
    assert meet_mime(("text/html",), ("image/png",)) is None


def test_http_capability_meet_resolves_defaults() -> None:
    a = NetHttpCapability(hosts=("*.github.com",))
    b = NetHttpCapability(hosts=("api.github.com",), methods=("get", "POST"), ports=(443, 8443))
    ((cap,),) = meet(a, b)
    assert cap == NetHttpCapability(hosts=("api.github.com",), ports=(443,),
                                    schemes=("https",), methods=("GET",), mime=())
    assert meet(a, NetHttpCapability(hosts=("x.com",))) == ()
    assert meet(a, NetHttpCapability(hosts=("*.github.com",), schemes=("http",))) == ()


def test_browser_scopes_intersect() -> None:
    a = BrowserCapability(hosts=("*.a.com",), scopes=(BrowserScope.OPEN, BrowserScope.SCREENSHOT))
    ((cap,),) = meet(a, BrowserCapability(hosts=("b.a.com",)))
    assert isinstance(cap, BrowserCapability)
    assert (cap.hosts, cap.scopes) == (("b.a.com",), (BrowserScope.OPEN,))


def test_fs_meet_of_unions_and_kinds() -> None:
    a = FsCapability(kind="fs.read", paths=("/a/**", "/b/**"))
    b = FsCapability(kind="fs.read", paths=("/a/x/**", "/b/y", "/c/**"))
    assert meet(a, b) == ((FsCapability(kind="fs.read", paths=("/a/x/**", "/b/y")),),)
    assert meet(a, FsCapability(kind="fs.write", paths=("/a/**",))) == ()
    home = meet(FsCapability(kind="fs.read", paths=("~/**",)),
                FsCapability(kind="fs.read", paths=("/home/u/.ssh/**",)), home="/home/u")
    assert home == ((FsCapability(kind="fs.read", paths=("/home/u/.ssh/**",)),),)


def test_proc_meet_same_tool_and_templates() -> None:
    t1 = (ArgSlot(alternatives=(ArgAlternative(literal="status"),)),)
    t2 = (ArgSlot(alternatives=(ArgAlternative(regex="--.*"),), repeat=True),)
    assert meet(ProcCapability(tool="git"), ProcCapability(tool="rm")) == ()
    assert meet(ProcCapability(tool="git"), ProcCapability(tool="git", args=t1)) == (
        (ProcCapability(tool="git", args=t1),),)
    assert meet(ProcCapability(tool="git", args=t1), ProcCapability(tool="git", args=t1)) == (
        (ProcCapability(tool="git", args=t1),),)
    ((x, y),) = meet(ProcCapability(tool="git", args=t1), ProcCapability(tool="git", args=t2))
    assert {x, y} == {ProcCapability(tool="git", args=t1), ProcCapability(tool="git", args=t2)}


def test_tmp_and_gpu() -> None:
    assert meet(TmpCapability(max_bytes=10), TmpCapability()) == ((TmpCapability(max_bytes=10),),)
    assert meet(TmpCapability(max_bytes=10), TmpCapability(max_bytes=5)) == (
        (TmpCapability(max_bytes=5),),)
    assert meet(GpuCapability(gpu_class="any"), GpuCapability(gpu_class="a100")) == (
        (GpuCapability(gpu_class="a100"),),)
    assert meet(GpuCapability(gpu_class="h100"), GpuCapability(gpu_class="a100")) == ()
