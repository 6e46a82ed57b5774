"""Compiled matchers answer as the patterns they replace: host sets, forbid screens, probes."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.errors import PolicyEngineError
from policy_engine.guard import nofollow
from policy_engine.guard import paths as guard_paths
from policy_engine.guard.compiled import _screen
from policy_engine.guard.matchers import HostSet, compile_matcher
from policy_engine.guard.urls import parse_url
from policy_engine.model import BrowserCapability, NetHttpCapability, ProcCapability
from policy_engine.patterns import HostPattern

HOST_PATTERNS = ["*", "example.com", "*.example.com", "a.example.com", "*.com", "10.0.0.0/8",
                 "127.0.0.1", "::1", "fd00::/8", "com", "xn--bcher-kva.example", "*.b.c"]
HOSTS = ["example.com", "a.example.com", "b.a.example.com", "xexample.com", "com", "b.c",
         "a.b.c", "10.1.2.3", "127.0.0.1", "::1", "fd00::5", "8.8.8.8", "xn--bcher-kva.example"]


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(HOST_PATTERNS), max_size=5), st.sampled_from(HOSTS))
def test_host_set_agrees_with_the_patterns(patterns: list[str], host: str) -> None:
    pats = [HostPattern.of(p) for p in patterns]
    ip = _ip(host)
    assert HostSet(pats).matches(host, ip) is any(p.matches(host, ip) for p in pats)


URLS = ["https://gist.github.com/x", "https://api.github.com/", "http://10.0.0.1:8080/",
        "https://a.evil.com/", "https://evil.com/", "http://[::1]/"]


@pytest.mark.parametrize("hosts", [("gist.github.com",), ("*.evil.com", "10.0.0.0/8"),
                                   ("not a host!",), ("::1",)])
def test_url_forbid_screen_never_hides_a_match(hosts: tuple[str, ...]) -> None:
    net = [compile_matcher(NetHttpCapability(hosts=hosts), "net.http", "/h", forbid=True)]
    browser = [compile_matcher(BrowserCapability(hosts=hosts), "browser.use", "/h", forbid=True)]
    for matchers, extra in ((net, "GET"), (browser, frozenset({"open"}))):
        screen = _screen(matchers)
        assert screen is not None
        for raw in URLS:
            res = (parse_url(raw), extra)
            if any(m.admits(res) for m in matchers):
                assert screen(res), (hosts, raw)
        assert screen((None, extra))  # a screenshot without a URL is always scanned


def test_tool_forbid_screen() -> None:
    matchers = [compile_matcher(ProcCapability(tool=t), "proc.exec", "/h", forbid=True)
                for t in ("curl", "wget")]
    screen = _screen(matchers)
    assert screen is not None
    assert screen(("curl", ()))
    assert not screen(("git", ("status",)))
    mixed = [*matchers, compile_matcher(NetHttpCapability(hosts=("a.com",)), "net.http", "/h",
                                        forbid=True)]
    assert _screen(mixed) is None


# --- the openat2 probe ---------------------------------------------------------------------------

def test_openat2_probe_is_available_on_this_kernel() -> None:
    # every machine of this project runs a kernel with openat2 (5.6+); if that ever changes this
    # fails loudly instead of silently skipping the probe tests below (the guard itself falls
    # back to the per-component walk, which the randomized tree test also covers)
    assert nofollow.available()


def test_the_guard_probes_with_the_native_extension_here() -> None:
    # the test command installs gcc and python3-dev, so `pip install` builds _nofollow.c; a
    # build that failed would leave the slower ctypes probe without anything saying so
    assert nofollow.NATIVE, "policy_engine/guard/_nofollow.c was not built: install gcc and " \
                            "python3-dev, then `pip install -e .` again"
    assert guard_paths.probe is nofollow.probe is nofollow.native.probe


PROBES = [pytest.param(nofollow.ctypes_probe, id="ctypes"),
          pytest.param(getattr(nofollow.native, "probe", None), id="native")]


@pytest.mark.parametrize("probe", PROBES)
def test_probe_outcomes(probe: nofollow.Probe, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    os.symlink("d", tmp_path / "link")
    os.symlink("f", tmp_path / "d" / "last-link")
    assert probe(f"{tmp_path}/d/f") == (nofollow.NO_LINK, None)
    assert probe(f"{tmp_path}/d") == (nofollow.NO_LINK, None)
    assert probe(f"{tmp_path}/d/missing/deeper") == (nofollow.MISSING, None)
    assert probe(f"{tmp_path}/link/f") == (nofollow.UNKNOWN, None)  # a link in the middle
    assert probe(f"{tmp_path}/d/last-link")[0] == nofollow.UNKNOWN  # a link at the end
    assert probe(f"{tmp_path}/link/missing")[0] == nofollow.UNKNOWN  # link before missing
    assert probe(f"{tmp_path}/d/f/below-a-file")[0] == nofollow.UNKNOWN  # ENOTDIR
    assert probe("/proc/self/status")[0] == nofollow.UNKNOWN  # a magic link
    assert probe(f"{tmp_path}/d/\udcff")[0] == nofollow.MISSING  # undecodable name
    assert probe(f"{tmp_path}/d/" + "n" * 300)[0] == nofollow.UNKNOWN  # ENAMETOOLONG
    # with the stat: mode and size as lstat says them, without a second walk
    (tmp_path / "big").write_bytes(b"x" * 70_000)
    os.mkfifo(tmp_path / "fifo")  # O_PATH opens nothing: a FIFO without a writer cannot block
    for name in ("d/f", "d", "big", "fifo"):
        st = os.lstat(tmp_path / name)
        assert probe(f"{tmp_path}/{name}", with_stat=True) == (nofollow.NO_LINK,
                                                               (st.st_mode, st.st_size)), name
    assert probe(f"{tmp_path}/d", True)[0] == nofollow.NO_LINK  # positional
    assert probe(f"{tmp_path}/link/f", with_stat=True) == (nofollow.UNKNOWN, None)
    assert probe(f"{tmp_path}/d/missing", with_stat=True) == (nofollow.MISSING, None)


@pytest.mark.parametrize("probe", [*PROBES, pytest.param(nofollow.open_no_symlinks,
                                                        id="open_no_symlinks")])
def test_the_probes_refuse_what_os_functions_refuse(probe: nofollow.Probe,
                                                    tmp_path: Path) -> None:
    # a C string ends at a NUL: passed on as bytes, the kernel would get the path before it
    # (outsider round 10, F3); every probe raises as os.lstat does (the guard never gets this
    # far: normalize_path refuses a NUL first)
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(ValueError, match="null"):
        probe(f"{tmp_path}/a.txt\x00/../../etc/shadow")
    with pytest.raises(TypeError):
        probe(b"/etc")


def test_the_native_probe_refuses_bad_calls() -> None:
    native = nofollow.native
    assert native is not None
    with pytest.raises(TypeError):
        native.probe()
    with pytest.raises(TypeError):
        native.probe("/etc", True, True)
    with pytest.raises(TypeError):
        native.probe("/etc", stat=True)


def test_the_native_probe_leaks_no_descriptor(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(2000):
        nofollow.probe(str(tmp_path / "f"))
        nofollow.probe(str(tmp_path / "f"), with_stat=True)
    assert len(os.listdir("/proc/self/fd")) == before


TREE_NAMES = ["a", "b", "c", "l1", "l2", "l3", "missing"]
LINK_TARGETS = ["a", "../a", "a/b", "/ROOT/a", "/ROOT/a/b", "../../outside", "/etc", "l2", "l1",
                "missing", "."]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(LINK_TARGETS), min_size=3, max_size=3),
       st.lists(st.lists(st.sampled_from(TREE_NAMES), min_size=1, max_size=4), min_size=1,
                max_size=12),
       st.sampled_from(["", "/a", "/a/b"]))
def test_probe_then_walk_equals_the_walk(targets: list[str], candidates: list[list[str]],
                                         root_suffix: str) -> None:
    """resolve_normalized with the probe answers exactly as the lstat walk alone."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "root"
        (base / "a" / "b" / "c").mkdir(parents=True)
        (base / "a" / "b" / "file").write_text("x")
        (Path(tmp) / "outside").mkdir()
        for i, target in enumerate(targets):
            where = base / ("a" if i == 1 else ".") / f"l{i + 1}"
            os.symlink(target.replace("/ROOT", str(base)), where)
        root = str(base) + root_suffix
        for segs in candidates:
            path = root + "/" + "/".join(segs)
            assert _resolve(root, path, probe=True) == _resolve(root, path, probe=False), path
            # the two probes answer alike on every path of the tree
            assert nofollow.ctypes_probe(path, True) == nofollow.probe(path, True), path


def _resolve(root: str, path: str, *, probe: bool) -> str:
    saved = guard_paths.probe
    if not probe:
        guard_paths.probe = lambda p: (nofollow.UNKNOWN, None)
    try:
        return guard_paths.resolve_normalized(root, path)
    except PolicyEngineError as exc:
        return f"refused: {exc.reason}"
    finally:
        guard_paths.probe = saved


def test_below_a_file_the_path_resolves_as_written_like_below_a_missing_one(
        tmp_path: Path) -> None:
    """Nothing exists below a file, as nothing below a missing component: both resolve to the
    path as written (after any link before them), so the decision cannot tell a hidden file
    from no file (outsider attack 35, F3; the file case was refused "cannot be resolved")."""
    root = str(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".env").write_text("x")
    os.symlink("d", tmp_path / "link")
    for name in (".env", "absent"):
        assert guard_paths.resolve_beneath(root, f"{root}/d/{name}/x") == f"{root}/d/{name}/x"
        assert guard_paths.resolve_beneath(root, f"{root}/link/{name}/x") == f"{root}/d/{name}/x"
