"""macOS sandbox-exec profiles (seed 003 test 8): goldens, structure by a real S-expression
parser, and what the rules decide, read by ``sbpl_eval`` (last matching rule wins).

Goldens live in tests/golden/sbpl/*.sb. They are rewritten only on purpose:
``PE_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_sbpl.py``; that run rewrites the files
and then fails, so a regeneration is never silent (review the diff, run again without it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from policy_engine.cli.main import cli
from policy_engine.model import NetworkMode, Profile
from policy_engine.patterns.paths import PathGlob, validate_glob
from policy_engine.sandbox.sbpl import SbplPathError, render_sbpl
from policy_engine.sandbox.sbpl_glob import glob_to_regex, path_filters
from tests.unit.guard_fixtures import forbid, fs, make_profile, permit
from tests.unit.sbpl_eval import Access, check_structure, decide, parse

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "sbpl"
UPDATE = os.environ.get("PE_UPDATE_GOLDEN") == "1"
HOME = "/Users/agent"
TMP = "/private/var/folders/zz/T/pe-mac-test"
MANDATORY = ("~/.ssh/**", "~/.aws/**", "/etc/shadow", "/etc/passwd", "**/.env",
             "**/credentials.json", "/var/run/**")


def example_profile(request: str) -> Profile:
    """The profile `policy-engine explain` compiles for an example request of the org policy."""
    # relative paths from the checkout: the profile (and its hash in the golden's header) names
    # the rule's file, which must not depend on where the repository is cloned
    with contextlib.chdir(ROOT):
        got = CliRunner().invoke(cli, [
            "explain", "--policy", "examples/policies/org.sbpolicy", "--request",
            f"examples/requests/{request}.json", "--format", "json"])
    assert got.exit_code == 0, got.output
    return Profile.model_validate(json.loads(got.output)["profile"])


def mandatory() -> object:
    return forbid(("fs.read", "fs.write", "fs.list"),
                  fs("fs.read", *(p.replace("~", HOME) for p in MANDATORY)),
                  rule="builtin:mandatory-secrets", mandatory=True)


def hand_profile(*caps: object, denies: tuple[object, ...] = (),
                 network: NetworkMode = NetworkMode.OFF, root: str = HOME) -> Profile:
    return make_profile(capabilities=caps, denies=(mandatory(), *denies),  # type: ignore[arg-type]
                        network=network, root_fs=root, home=HOME, profile_hash="ab" * 32)


def project_profile(network: NetworkMode = NetworkMode.OFF) -> Profile:
    """A whitelist with blacklisted paths inside it: a secrets dir, hooks, a listing."""
    return hand_profile(
        permit("fs.read", fs("fs.read", f"{HOME}/project/**")),
        permit("fs.write", fs("fs.write", f"{HOME}/project/**")),
        denies=(forbid(("fs.read",), fs("fs.read", f"{HOME}/project/secrets/**"), rule="f-read"),
                forbid(("fs.write",), fs("fs.write", f"{HOME}/project/.git/hooks/**"),
                       rule="f-write"),
                forbid(("fs.list",), fs("fs.list", f"{HOME}/project/private"), rule="f-list")),
        network=network)


CASES: dict[str, tuple[object, dict[str, object]]] = {
    "org-git-status": (lambda: example_profile("git-status"), {"tmpdir": TMP}),
    "org-list-workspace": (lambda: example_profile("list-workspace"), {}),
    "read-only": (lambda: hand_profile(permit("fs.read", fs("fs.read", f"{HOME}/docs/**"))), {}),
    "writable-globs": (lambda: hand_profile(
        permit("fs.read", fs("fs.read", f"{HOME}/src/**")),
        permit("fs.write", fs("fs.write", f"{HOME}/src/*/out/**", f"{HOME}/src/**/build/*.o")),
        permit("fs.write", fs("fs.write", f"{HOME}/**"), fs("fs.write", "/tmp/**", f"{HOME}/a/**"),
               rule="meet")), {"tmpdir": TMP}),
    "blacklist-in-whitelist": (lambda: project_profile(), {}),
    "network-on": (lambda: project_profile(NetworkMode.ON), {}),
    "network-restricted": (lambda: project_profile(NetworkMode.RESTRICTED), {"proxy_port": 8123}),
}


def render_case(name: str) -> str:
    """The text alone (``resolve=None``): a golden must not depend on this host's symlinks
    (``/var/run`` → ``/run`` here); resolution is tested with real symlinks below."""
    build, opts = CASES[name]
    return render_sbpl(build(), resolve=None, **opts)  # type: ignore[operator,arg-type]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_profile(name: str) -> None:
    text = render_case(name)
    path = GOLDEN / f"{name}.sb"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.fail(f"rewrote {path.relative_to(ROOT)} (PE_UPDATE_GOLDEN=1): review the diff, "
                    "then run again without it")
    assert path.exists(), f"no golden {path}; create it with PE_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_profile_parses_and_is_well_formed(name: str) -> None:
    forms = check_structure(render_case(name))
    heads = [f[0].value() for f in forms]
    assert heads[:2] == ["version", "deny"]
    assert forms[1][1].value() == "default"
    # every golden on disk is a case (no stale file) and also well-formed
    assert {p.stem for p in GOLDEN.glob("*.sb")} <= set(CASES)
    check_structure((GOLDEN / f"{name}.sb").read_text(encoding="utf-8"))


def test_rendering_is_deterministic_whatever_the_order() -> None:
    a = project_profile()
    b = a.model_copy(update={"capabilities": a.capabilities[::-1], "denies": a.denies[::-1]})
    assert render_sbpl(a) == render_sbpl(b) == render_sbpl(a)


def test_seed003_case08_macos_profile_generation() -> None:
    """Seed 003 test 8: sandbox-exec profile generated correctly — from the org policy's
    profile of `git status`: closed by default, processes may start, the workspace readable,
    the blacklist (also inside the workspace) closed, the network denied."""
    profile = example_profile("git-status")
    text = render_sbpl(profile, tmpdir=TMP)
    forms = check_structure(text)
    assert text.startswith("(version 1)\n")
    assert "\n(deny default)\n" in text
    assert "\n(allow process-exec)\n" in text
    assert "\n(allow process-fork)\n" in text
    assert "\n(deny network*)\n" in text

    def ok(op: str, path: str, vnode: str = "REGULAR-FILE") -> bool:
        return decide(forms, Access(op, path, vnode))

    assert ok("file-read-data", "/workspace/src/main.py")
    assert ok("process-exec", "/usr/bin/git")
    assert ok("file-read-data", "/usr/bin/git")
    assert not ok("file-write-data", "/workspace/src/main.py")  # fs.read only
    assert ok("file-write-data", f"{TMP}/scratch")
    for secret in ("/root/.ssh/id_ed25519", "/workspace/.env", "/workspace/a/b/.env",
                   "/workspace/.secrets/token", "/workspace/k.pem", "/private/etc/passwd",
                   "/private/etc/master.passwd", "/private/var/run/docker.sock"):
        assert not ok("file-read-data", secret), secret
        assert not ok("file-write-data", secret), secret
    assert not ok("file-read-data", "/Users/other/notes.txt")
    assert not ok_net(forms, "ip", "1.1.1.1:443")


def ok_net(forms: list[object], kind: str, target: str) -> bool:
    return decide(forms, Access("network-outbound", remote=(kind, target)))


def test_every_deny_follows_every_allow() -> None:
    """SBPL's last matching rule wins: a deny written before an allow would be lifted by it."""
    forms = parse(render_sbpl(project_profile(NetworkMode.ON)))
    # the one earlier deny narrows the system trees (/System/Volumes) before any profile allow
    system_volumes = f'(regex #"{glob_to_regex("/System/Volumes/**", deny=True)}")'
    file_rules = [(i, f[0].value()) for i, f in enumerate(forms) if isinstance(f, list)
                  and any(getattr(x, "value", lambda: "")().startswith("file-") for x in f[1:3])
                  and f[-1] != parse(system_volumes)[0]]
    last_allow = max(i for i, a in file_rules if a == "allow")
    first_deny = min(i for i, a in file_rules if a == "deny")
    assert last_allow < first_deny


def test_blacklist_inside_whitelist_wins() -> None:
    """Seed 003 test 3, as the kernel would decide it from the generated rules."""
    forms = parse(render_sbpl(project_profile()))
    p = f"{HOME}/project"
    assert decide(forms, Access("file-write-data", f"{p}/src/a.py"))
    for op in ("file-read-data", "file-write-data"):
        assert not decide(forms, Access(op, f"{p}/.env"))
        assert not decide(forms, Access(op, f"{p}/secrets/key"))
        assert not decide(forms, Access(op, f"{p}/secrets"))
    assert decide(forms, Access("file-read-data", f"{p}/.git/hooks/pre-commit"))
    assert not decide(forms, Access("file-write-data", f"{p}/.git/hooks/pre-commit"))
    assert not decide(forms, Access("file-read-data", f"{p}/private", "DIRECTORY"))
    assert decide(forms, Access("file-read-data", f"{p}/private/readme", "REGULAR-FILE"))


def test_a_write_allow_never_lifts_a_mandatory_deny() -> None:
    """Attack: an fs.write of the whole home (a later, broader allow) over ~/.ssh."""
    forms = parse(render_sbpl(hand_profile(permit("fs.write", fs("fs.write", f"{HOME}/**")))))
    assert decide(forms, Access("file-write-data", f"{HOME}/notes.txt"))
    assert not decide(forms, Access("file-write-data", f"{HOME}/.ssh/authorized_keys"))
    assert not decide(forms, Access("file-read-data", f"{HOME}/.aws/credentials"))


@pytest.mark.parametrize(("glob", "outside"), [
    (f"{HOME}/a.b/*.txt", f"{HOME}/aXb/x.txt"),  # `.` is not "any character"
    (f"{HOME}/a+b/*", f"{HOME}/aab/x"),  # `+` is not "one or more"
    (f"{HOME}/(x|y)/*", f"{HOME}/x/f"),  # no alternation
    (f"{HOME}/[ab]/*", f"{HOME}/a/f"),  # no character class
    (f"{HOME}/^$/*", f"{HOME}/f"),  # no anchors mid-pattern
    (f"{HOME}/a{{2}}/*", f"{HOME}/aa/f"),  # no repetition
    (f"{HOME}/w/*.txt", f"{HOME}/w/sub/x.txt"),  # `*` stays in one segment
    (f"{HOME}/w/**", f"{HOME}/w-evil/x"),  # `**` is segment-bounded
    (f"{HOME}/w/**/x", f"{HOME}/w/ax"),
    (f"{HOME}/w/**/x", f"{HOME}/wx"),
    (f"{HOME}/w/**/x/**", f"{HOME}/w/y/xz"),
])
def test_regex_metacharacters_and_odd_globstars_never_widen(glob: str, outside: str) -> None:
    forms = parse(render_sbpl(hand_profile(permit("fs.read", fs("fs.read", glob)))))
    assert not decide(forms, Access("file-read-data", outside)), (glob, outside)
    assert PathGlob.of(glob).matches(outside) is False


@pytest.mark.parametrize("path", [
    f'{HOME}/x") (allow file-read* (subpath "/")) ("/**',  # a quote closes the string
    f"{HOME}/x\n(allow file-read*)\n/**",  # a newline
    f"{HOME}/back\\slash/**",
    f"{HOME}/tab\there",
    f"{HOME}/del\x7f/**",
])
def test_paths_that_could_break_out_of_a_string_are_refused(path: str) -> None:
    for cap in (permit("fs.read", fs("fs.read", path)),):
        with pytest.raises(SbplPathError, match="SBPL001"):
            render_sbpl(hand_profile(cap))
    with pytest.raises(SbplPathError, match="SBPL001"):  # a deny too: fail closed
        render_sbpl(hand_profile(denies=(forbid(("fs.read",), fs("fs.read", path)),)))


def test_parentheses_and_semicolons_stay_inside_their_string() -> None:
    glob = f"{HOME}/a)b (c;d/**"
    text = render_sbpl(hand_profile(permit("fs.read", fs("fs.read", glob))))
    forms = check_structure(text)
    assert f'(subpath "{HOME}/a)b (c;d")' in text
    assert decide(forms, Access("file-read-data", f"{HOME}/a)b (c;d/f"))
    assert not decide(forms, Access("file-read-data", f"{HOME}/other"))


def test_a_hostile_profile_hash_cannot_inject_a_form() -> None:
    profile = hand_profile().model_copy(update={"profile_hash": "ab\n(allow default)\n"})
    text = render_sbpl(profile)
    assert "(allow default)" not in text
    assert not decide(parse(text), Access("file-read-data", "/anything"))


def test_macos_resolves_etc_tmp_var_through_private() -> None:
    forms = parse(render_sbpl(hand_profile(
        permit("fs.write", fs("fs.write", "/tmp/work/**")),
        denies=(forbid(("fs.read",), fs("fs.read", "/*/shadow")),
                forbid(("fs.read",), fs("fs.read", "/v?r/secret"))), root="/")))
    assert decide(forms, Access("file-write-data", "/private/tmp/work/a"))
    assert not decide(forms, Access("file-read-data", "/private/etc/passwd"))
    assert not decide(forms, Access("file-read-data", "/private/etc/shadow"))
    assert not decide(forms, Access("file-read-data", "/private/var/secret"))


@pytest.mark.parametrize(("mode", "opts", "allowed", "refused"), [
    (NetworkMode.OFF, {}, [], [("ip", "1.1.1.1:443"), ("ip", "localhost:8123")]),
    (NetworkMode.ON, {}, [("ip", "1.1.1.1:443"), ("unix-socket", "/private/var/run/mDNSResponder")],
     []),
    (NetworkMode.RESTRICTED, {"proxy_port": 8123}, [("ip", "localhost:8123")],
     [("ip", "localhost:22"), ("ip", "1.1.1.1:443")]),
    (NetworkMode.RESTRICTED, {}, [], [("ip", "localhost:8123"), ("ip", "1.1.1.1:443")]),
])
def test_network_modes_and_host_control_sockets(mode: NetworkMode, opts: dict[str, int],
                                               allowed: list[tuple[str, str]],
                                               refused: list[tuple[str, str]]) -> None:
    forms = parse(render_sbpl(project_profile(mode), **opts))  # type: ignore[arg-type]
    for kind, target in allowed:
        assert ok_net(forms, kind, target), (mode, target)
    for kind, target in [*refused, ("unix-socket", "/private/var/run/docker.sock"),
                         ("unix-socket", f"{HOME}/.docker/run/docker.sock"),
                         ("unix-socket", "/private/tmp/com.apple.launchd.x/Listeners")]:
        assert not ok_net(forms, kind, target), (mode, target)


def test_allows_are_clamped_to_root_fs() -> None:
    """As the Linux sandboxes clamp their binds: an fs.read of /tmp with root_fs ~ opens
    nothing outside ~ (the guard refuses such ops; the sandbox agrees)."""
    forms = parse(render_sbpl(hand_profile(permit("fs.read", fs("fs.read", "/tmp/**")))))
    assert not decide(forms, Access("file-read-data", "/private/tmp/x"))
    assert not decide(forms, Access("file-read-data", "/tmp/x"))


@pytest.mark.parametrize("port", [70000, 0, True])
def test_a_bad_proxy_port_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match="proxy_port"):
        render_sbpl(project_profile(NetworkMode.RESTRICTED), proxy_port=port)


def test_the_profile_deny_list_is_closed_too() -> None:
    """Fail closed: a path on the profile's deny-list summary is denied even when no forbid
    rule carries it (it can only repeat or narrow them)."""
    from policy_engine.model import DenyLists
    profile = hand_profile(permit("fs.read", fs("fs.read", f"{HOME}/**"))).model_copy(
        update={"deny": DenyLists(paths=(f"{HOME}/vault/**",))})
    forms = parse(render_sbpl(profile))
    assert decide(forms, Access("file-read-data", f"{HOME}/notes"))
    assert not decide(forms, Access("file-read-data", f"{HOME}/vault/key"))


_CHARS = ["a", "B", "s", "k", ".", "+", "(", "|", "[", "^", "$", "{",
          "ä", "é", "e\u0301", "€", "😀"]
_SEG = st.lists(st.sampled_from([*_CHARS, "*", "?"]), min_size=1, max_size=3).map("".join)
_GLOB = st.lists(st.one_of(st.just("**"), _SEG), min_size=1, max_size=4).map(
    lambda segs: "/" + "/".join(segs))
_PATH = st.lists(st.lists(st.sampled_from([*_CHARS, "\n", "x"]), min_size=1, max_size=3)
                 .map("".join), min_size=1, max_size=5).map(lambda segs: "/" + "/".join(segs))


def _admitted(filters: list[str], path: str) -> bool:
    """Whether any of ``filters`` admits ``path``, matched as UTF-8 bytes (``sbpl_eval``)."""
    return any(decide([None, [sexp_symbol("allow"), sexp_symbol("file-read*"),  # type: ignore[list-item]
                              parse(f)[0]]], Access("file-read-data", path)) for f in filters)


@settings(max_examples=400, deadline=None)
@given(_GLOB, _PATH)
def test_sbpl_filters_admit_exactly_what_the_engine_glob_admits(glob: str, path: str) -> None:
    """Property: for any glob and path (metacharacters, newlines, non-ASCII characters in NFC
    and NFD, `**` anywhere), matched as the kernel does (UTF-8 bytes): an allow's filters admit
    at most what ``PathGlob`` admits, exactly as much for printable-ASCII names; a deny's admit
    at least that, in both normalization forms and any case (outside /etc, /tmp, /var, where
    /private forms add the resolved spelling of the same files)."""
    import unicodedata
    assume(validate_glob(glob) is None)
    assume(not re.match(r"^/(etc|tmp|var|private)(/|$)", path))
    # fullmatch: `PathGlob.matches` uses re.match with `$`, which also matches before a final
    # newline (`/a` admits "/a\n"); the SBPL side is exact, the comparison is with exactness
    want = PathGlob.of(glob).regex.fullmatch(path) is not None
    allowed = _admitted(path_filters(glob), path)
    assert not allowed or want, ("allow wider than the engine", glob, path, path_filters(glob))
    if path.isascii() and path.isprintable():
        assert allowed == want, (glob, path, path_filters(glob))
    if want:
        denied = path_filters(glob, deny=True)
        for form in ("NFC", "NFD"):  # and in other cases: APFS is case-insensitive too
            for spelled in {unicodedata.normalize(form, p) for p in (path, path.swapcase())}:
                assert _admitted(denied, spelled), ("deny narrower", glob, spelled, denied)


@st.composite
def _glob_and_a_path_it_admits(draw: st.DrawFn) -> tuple[str, str]:
    """A glob and a path the engine's glob admits: each wildcard replaced by what it matches."""
    segs = draw(st.lists(st.one_of(st.just("**"), _SEG), min_size=1, max_size=4))
    name = st.lists(st.sampled_from([*_CHARS, "x"]), min_size=1, max_size=3).map("".join)
    out: list[str] = []
    for seg in segs:
        if seg == "**":
            out += draw(st.lists(name, max_size=2))
            continue
        out.append("".join(
            draw(st.sampled_from(_CHARS)) if ch == "?" else
            "".join(draw(st.lists(st.sampled_from(_CHARS), max_size=2))) if ch == "*" else ch
            for ch in seg))
    return "/" + "/".join(segs), "/" + "/".join(x for x in out if x)


@settings(max_examples=300, deadline=None)
@given(_glob_and_a_path_it_admits(), st.randoms(use_true_random=False))
def test_a_deny_admits_every_spelling_of_what_the_engine_glob_admits(
        pair: tuple[str, str], rnd: object) -> None:
    """Property: for a path the engine's glob admits, the deny filters admit it in NFC, NFD,
    swapped case and a per-character mix of those (APFS: one name), as UTF-8 bytes."""
    import random
    import unicodedata
    glob, path = pair
    assume(validate_glob(glob) is None and path != "/" and "//" not in path)
    assume(PathGlob.of(glob).regex.fullmatch(path) is not None)
    assert isinstance(rnd, random.Random)
    mixed = "".join(unicodedata.normalize(rnd.choice(("NFC", "NFD")),
                                          c.swapcase() if rnd.random() < 0.5 else c)
                    for c in path)
    denied = path_filters(glob, deny=True)
    for spelled in (path, unicodedata.normalize("NFD", path), path.swapcase(), mixed):
        assert _admitted(denied, spelled), (glob, spelled, denied)


_TAIL = st.lists(st.one_of(st.just("**"), _SEG), min_size=1, max_size=3).map("/".join)


@settings(max_examples=150, deadline=None)
@given(_TAIL)
def test_a_deny_below_a_symlinked_ancestor_covers_the_resolved_path(
        tmp_path_factory: pytest.TempPathFactory, tail: str) -> None:
    """Property (F3): a deny written through a symlinked directory (a symlinked HOME) holds
    for the resolved path of every file the engine's glob denies by the written path."""
    base = _symlinked_home(tmp_path_factory)
    glob = f"{base}/homelink/{tail}"
    assume(validate_glob(glob) is None)
    rel = tail.replace("**", "x/y").replace("*", "ab").replace("?", "ä")  # a path it denies
    assert PathGlob.of(glob).regex.fullmatch(f"{base}/homelink/{rel}") is not None
    forms = parse(render_sbpl(hand_profile(
        permit("fs.read", fs("fs.read", "/**")),
        denies=(forbid(("fs.read",), fs("fs.read", glob)),), root="/")))
    for p in (f"{base}/home/{rel}", f"{base}/homelink/{rel}"):
        assert not decide(forms, Access("file-read-data", p)), (glob, p)


_HOMES: dict[str, str] = {}


def _symlinked_home(factory: pytest.TempPathFactory) -> str:
    if "base" not in _HOMES:
        base = factory.mktemp("symhome")
        (base / "home").mkdir()
        (base / "homelink").symlink_to(base / "home")
        _HOMES["base"] = str(base)
    return _HOMES["base"]


def sexp_symbol(name: str) -> object:
    from sexpdata import Symbol
    return Symbol(name)


# --- outsider attack round 3 (findings3 F2-F4): byte matching, symlinked ancestors, firmlinks ---

def _blacklisted(*globs: str, read_outside: bool = False, **opts: object) -> list[object]:
    """A whitelisted project with ``globs`` forbidden for reading (the sandbox.json shape)."""
    caps = [permit("fs.write", fs("fs.write", f"{HOME}/proj/**"))]
    if read_outside:
        caps.append(permit("fs.read", fs("fs.read", "/**")))
    return parse(render_sbpl(hand_profile(
        *caps, denies=(forbid(("fs.read",), fs("fs.read", *globs), rule="blacklist"),),
        root="/"), **opts))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["secretx.txt", "secretä.txt", "secret€.txt", "secret😀.txt",
                                  "secret\u0301.txt"])
def test_f2_question_mark_deny_covers_a_multibyte_character(name: str) -> None:
    """F2: `?` is one character for the engine; the kernel matches the path's UTF-8 bytes."""
    assert PathGlob.of(f"{HOME}/proj/secret?.txt").matches(f"{HOME}/proj/{name}")
    forms = _blacklisted(f"{HOME}/proj/secret?.txt")
    assert not decide(forms, Access("file-read-data", f"{HOME}/proj/{name}")), name
    assert decide(forms, Access("file-read-data", f"{HOME}/proj/secret.txt"))
    assert decide(forms, Access("file-read-data", f"{HOME}/proj/secretab.txt"))


def test_f2_question_mark_allow_never_admits_two_characters() -> None:
    """An allow's `?` admits at most one engine character, whatever the byte semantics."""
    forms = parse(render_sbpl(hand_profile(permit("fs.read", fs("fs.read", f"{HOME}/d/a?")))))
    assert decide(forms, Access("file-read-data", f"{HOME}/d/ax"))
    for two in ("axy", "aé", "a\u00e9x"):  # never more than one character
        assert PathGlob.of(f"{HOME}/d/a?").matches(f"{HOME}/d/{two}") is (len(two) == 2)
        if len(two) != 2:
            assert not decide(forms, Access("file-read-data", f"{HOME}/d/{two}")), two


@pytest.mark.parametrize("form", ["NFC", "NFD"])
def test_f2_a_non_ascii_deny_holds_in_both_normalization_forms(form: str) -> None:
    """APFS is normalization-insensitive: `café` (NFC) and `cafe\u0301` (NFD) are one name."""
    import unicodedata
    forms = _blacklisted(f"{HOME}/proj/café/**", f"{HOME}/proj/naïve.key")
    for p in (f"{HOME}/proj/café/k", f"{HOME}/proj/naïve.key"):
        spelled = unicodedata.normalize(form, p)
        assert not decide(forms, Access("file-read-data", spelled)), spelled
    assert decide(forms, Access("file-read-data", f"{HOME}/proj/cafe/k"))


def test_f3_a_deny_below_a_symlinked_home_is_denied_at_the_resolved_path(tmp_path: Path) -> None:
    """F3: HOME reached through a symlink; macOS checks the resolved path."""
    real = tmp_path / "home"
    (real / ".ssh").mkdir(parents=True)
    (real / "proj").mkdir()
    link = tmp_path / "homelink"
    link.symlink_to(real)
    caps = [permit("fs.write", fs("fs.write", f"{link}/proj/**")),
            permit("fs.read", fs("fs.read", "/**"))]
    profile = make_profile(capabilities=caps, denies=(forbid(  # type: ignore[arg-type]
        ("fs.read", "fs.write", "fs.list"), fs("fs.read", f"{link}/.ssh/**", f"{link}/.netrc",
                                               f"{link}/proj/*.pem"), mandatory=True),),
        network=NetworkMode.OFF, root_fs="/", home=str(link), profile_hash="ab" * 32)
    forms = parse(render_sbpl(profile))
    for p in (f"{real}/.ssh/id_rsa", f"{real}/.netrc", f"{real}/proj/k.pem",
              f"{link}/.ssh/id_rsa", f"{link}/.netrc"):
        assert not decide(forms, Access("file-read-data", p)), p
        assert not decide(forms, Access("file-write-data", p)), p
    assert decide(forms, Access("file-read-data", f"{real}/proj/notes"))


def test_f3_an_allow_is_never_widened_to_a_resolved_spelling(tmp_path: Path) -> None:
    """Allows stay as the engine wrote them: resolving could only widen them."""
    real = tmp_path / "data"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    forms = parse(render_sbpl(hand_profile(
        permit("fs.read", fs("fs.read", f"{tmp_path}/link/**")), root="/")))
    assert decide(forms, Access("file-read-data", f"{tmp_path}/link/f"))
    assert not decide(forms, Access("file-read-data", f"{real}/f"))


@pytest.mark.parametrize("read_outside", [False, True])
def test_f4_the_data_volume_spelling_never_reaches_a_secret(read_outside: bool) -> None:
    """F4: /System/Volumes/Data is the data volume; /Users and /private are firmlinks into it."""
    forms = _blacklisted(f"{HOME}/proj/secrets/**", read_outside=read_outside)
    data = "/System/Volumes/Data"
    for p in (f"{HOME}/.ssh/id_rsa", f"{HOME}/proj/.env", f"{HOME}/proj/secrets/k",
              "/private/etc/master.passwd", "/private/var/run/docker.sock"):
        assert not decide(forms, Access("file-read-data", p)), p
        assert not decide(forms, Access("file-read-data", data + p)), data + p
        assert not decide(forms, Access("file-write-data", data + p)), data + p
    # the engine allows no read outside the project: neither does the data-volume spelling
    assert decide(forms, Access("file-read-data", f"{data}{HOME}/notes")) is read_outside
    for spelled in ("/System/volumes/Data", "/system/Volumes/data", "/System/VOLUMES/Data"):
        assert decide(forms, Access("file-read-data", f"{spelled}{HOME}/notes")) is read_outside
    assert decide(forms, Access("file-read-data", "/System/Library/Frameworks/x"))
    # the swap volume: closed unless the profile itself reads everything (`/**`)
    assert decide(forms, Access("file-read-data", "/System/Volumes/VM/swapfile0")) is read_outside
    assert decide(forms, Access("file-read-data", "/System/Volumes/Preboot/Cryptexes/OS/x"))


def test_a_deny_also_covers_named_forks_beneath_the_file() -> None:
    """`file/..namedfork/data` is the file's content on macOS: a literal deny must cover it."""
    forms = _blacklisted(f"{HOME}/proj/key.txt", "/**/token")
    for p in (f"{HOME}/proj/key.txt/..namedfork/data", f"{HOME}/proj/a/token/..namedfork/rsrc"):
        assert not decide(forms, Access("file-read-data", p)), p


@pytest.mark.parametrize("path", [
    f"{HOME}/.SSH/id_rsa", f"{HOME}/.Ssh/id_rsa", f"{HOME}/.aw\u017f/credentials",
    "/USERS/AGENT/.ssh/id_rsa", f"{HOME}/proj/.ENV", f"{HOME}/proj/a/Credentials.JSON",
    f"{HOME}/proj/SECRETS/k", f"/System/Volumes/Data{HOME}/.SSH/id_rsa",
    "/private/ETC/master.passwd", f"{HOME}/proj/\u00c4RGER.key", f"{HOME}/proj/A\u0308rger.key",
])
def test_f12_denies_hold_on_a_case_insensitive_volume(path: str) -> None:
    """F12: APFS is case-insensitive by default: `.SSH` is `.ssh`, `.ENV` is `.env` (and the
    Kelvin sign / long s fold to `k` / `s`). An allow of `~/.SSH` never lifts the deny."""
    forms = parse(render_sbpl(hand_profile(
        permit("fs.write", fs("fs.write", f"{HOME}/proj/**", f"{HOME}/.SSH/**")),
        denies=(forbid(("fs.read",), fs("fs.read", f"{HOME}/proj/secrets/**",
                                        f"{HOME}/proj/ärger.key")),), root="/")))
    assert not decide(forms, Access("file-read-data", path)), path
    assert not decide(forms, Access("file-write-data", path)), path
    assert decide(forms, Access("file-write-data", f"{HOME}/proj/README"))
    assert not decide(forms, Access("file-write-data", f"{HOME}/.SSH/known_hosts_notes"))


def test_the_os_cryptex_stays_resolvable_under_the_closed_system_volumes() -> None:
    """/System/Volumes is closed, yet the path to the OS cryptex (the dyld shared cache) can be
    resolved (`stat` of its ancestors) and read; the data volume cannot even be stat'ed."""
    forms = parse(render_sbpl(hand_profile()))
    for d in ("/System/Volumes", "/System/Volumes/Preboot", "/System/Volumes/Preboot/Cryptexes"):
        assert decide(forms, Access("file-read-metadata", d, "DIRECTORY")), d
    assert not decide(forms, Access("file-read-data", "/System/Volumes", "DIRECTORY"))
    assert not decide(forms, Access("file-read-metadata", "/System/Volumes/Data/Users"))
    assert decide(forms, Access("file-read-data", "/System/Volumes/Preboot/Cryptexes/OS/lib"))


@pytest.mark.parametrize(("glob", "name"), [
    ("secret?.txt", "secrete\u0301.txt"),  # `?` over a decomposed é (NFD: two code points)
    ("secret?.txt", "secretE\u0301.txt"),
    ("\u00e9\u00e9.key", "\u00e9e\u0301.key"),  # one name in mixed NFC/NFD spelling
    ("\u00e9\u00e9.key", "E\u0301\u00c9.KEY"),
])
def test_f2_decomposed_and_mixed_spellings_stay_denied(glob: str, name: str) -> None:
    """APFS compares names after normalization: every NFC/NFD/case spelling of a denied name
    is the same file, whatever mix of them the path uses."""
    import unicodedata
    # the engine denies the name's NFC, lower-case spelling: the same file on APFS
    canonical = unicodedata.normalize("NFC", name).lower()
    assert PathGlob.of(f"{HOME}/proj/{glob}").matches(f"{HOME}/proj/{canonical}")
    forms = _blacklisted(f"{HOME}/proj/{glob}")
    assert not decide(forms, Access("file-read-data", f"{HOME}/proj/{name}")), name


def test_the_non_ascii_folds_to_ascii_are_exactly_the_long_s_and_the_kelvin_sign() -> None:
    """The hard-coded table (kept so ASCII-only profiles never scan Unicode) is complete."""
    from policy_engine.sandbox.sbpl_glob import _FOLDS_TO_ASCII
    found = {chr(cp).casefold(): chr(cp) for cp in range(0x80, 0x110000)
             if len(chr(cp).casefold()) == 1 and chr(cp).casefold().isascii()}
    assert found == _FOLDS_TO_ASCII


@pytest.mark.parametrize(("glob", "name"), [("ας.key", "ΑΣ.key"), ("ασ.key", "ας.key"),
                                            ("Straße", "STRAẞE")])
def test_f12_non_ascii_case_folding_classes(glob: str, name: str) -> None:
    """Final sigma folds to sigma; capital sharp s (U+1E9E) folds to ß: same names on APFS."""
    assert glob.casefold() == name.casefold()
    forms = _blacklisted(f"{HOME}/proj/{glob}")
    assert not decide(forms, Access("file-read-data", f"{HOME}/proj/{name}")), name


def test_a_deny_on_an_upper_case_etc_glob_reaches_private() -> None:
    """`/E*/x` is `/Etc/x` for the engine, i.e. /private/etc/x on a case-insensitive volume."""
    forms = _blacklisted("/E*/secret", "/TMP/k")
    for p in ("/private/etc/secret", "/private/tmp/k", "/Etc/secret"):
        assert not decide(forms, Access("file-read-data", p)), p
