"""GlobSet (guard.globset) answers exactly as the per-glob regexes on normalized paths."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.guard.globset import GlobSet
from policy_engine.guard.matchers import path_regex
from policy_engine.guard.paths import normalize_path

HOME = "/home/agent"
SEGMENTS = ["a", "b", ".env", ".envrc", "x.y", "ab", "home", "agent", ".ssh", "a\nb", "[a]", "é"]
GLOB_SEGMENTS = [*SEGMENTS, "*", "?", "a*", "*.y", "**", "a?"]

paths = st.lists(st.sampled_from(SEGMENTS), max_size=6).map(lambda s: "/" + "/".join(s))
globs = st.builds(
    lambda start, segs, slash: start + "/".join(segs) + ("/" if slash and segs else ""),
    st.sampled_from(["/", "~/", "**/", "~", "**"]),
    st.lists(st.sampled_from(GLOB_SEGMENTS), max_size=4),
    st.booleans(),
)


def reference(patterns: list[str], path: str, forbid: bool) -> bool:
    return path_regex(patterns, HOME, forbid=forbid).match(path) is not None


@settings(max_examples=3000, deadline=None)
@given(st.lists(globs, max_size=5), st.lists(paths, min_size=1, max_size=8), st.booleans())
def test_globset_agrees_with_the_regexes(patterns: list[str], candidates: list[str],
                                         forbid: bool) -> None:
    gs = GlobSet(patterns, HOME, forbid=forbid)
    for path in candidates:
        assert normalize_path(path) == path  # the invariant GlobSet relies on
        assert gs.match(path) is reference(patterns, path, forbid), (patterns, path)
        assert gs.admits(path) is gs.match(path)


SECRETS = ["~/.ssh/**", "~/.aws/**", "**/.env", "/etc/shadow", "**/.env.local",
           "**/credentials.json", "/var/run/docker.sock", "/workspace/work/.git/**"]


@pytest.mark.parametrize(("path", "want"), [
    ("/workspace/app/.env", True), ("/.env", True), ("/workspace/app/.env.example", False),
    ("/workspace/app/x.env", False), ("/home/agent/.ssh", True), ("/home/agent/.ssh/id_rsa", True),
    ("/home/agent/.sshx", False), ("/home/agent", False), ("/etc/shadow", True),
    ("/etc/shadow.bak", False), ("/workspace/work/.git", True),
    ("/workspace/work/.gitignore", False),
    ("/a/b/credentials.json", True), ("/var/run/docker.sock", True),
])
def test_secret_globs(path: str, want: bool) -> None:
    gs = GlobSet(SECRETS * 3, HOME, forbid=True)  # the same list three times, as a profile has it
    assert gs.match(path) is want
    assert reference(SECRETS, path, True) is want


def test_shapes_are_sorted_into_string_tests() -> None:
    gs = GlobSet([*SECRETS, "/workspace/*.py", "/workspace/*.py"], HOME, forbid=True)
    assert gs.exact == {"/etc/shadow", "/var/run/docker.sock", "/home/agent/.ssh",
                        "/home/agent/.aws", "/workspace/work/.git"}
    assert gs.tails == ("/.env", "/.env.local", "/credentials.json")
    assert gs.regex is not None
    assert gs.regex.pattern.count("py") == 1  # deduplicated


def test_invalid_glob_and_everything() -> None:
    assert GlobSet(["relative/x"], HOME, forbid=True).match("/anything")
    assert not GlobSet(["relative/x"], HOME, forbid=False).match("/anything")
    assert GlobSet(["/**"], HOME, forbid=False).match("/")
    assert not GlobSet([], HOME, forbid=True).match("/x")


@settings(max_examples=1500, deadline=None)
@given(st.lists(globs, max_size=6), st.lists(paths, min_size=1, max_size=8), st.booleans())
def test_many_prefixes_looked_up_by_ancestor_agree_too(patterns: list[str],
                                                        candidates: list[str],
                                                        forbid: bool) -> None:
    from policy_engine.guard import globset

    saved = globset._MANY_PREFIXES
    globset._MANY_PREFIXES = 0  # every set with a `P/**` glob takes the ancestor lookup
    try:
        gs = GlobSet(patterns, HOME, forbid=forbid)
    finally:
        globset._MANY_PREFIXES = saved
    for path in candidates:
        assert gs.match(path) is reference(patterns, path, forbid), (patterns, path)


def test_thousands_of_subtrees() -> None:
    gs = GlobSet([f"/data/t{i}/private/**" for i in range(2000)], HOME, forbid=True)
    assert gs.match("/data/t1999/private/x")
    assert gs.match("/data/t7/private")
    assert not gs.match("/data/t7/privat")
    assert not gs.match("/data/t20000/private/x")


@pytest.mark.parametrize(("path", "want"), [
    ("/k.pem", True), ("/a/b/k.pem", True), ("/a/k.pem/x", False), ("/a/.pem", True),
    ("/a/kpem", False), ("/", False), ("/a/b\n.pem", True), ("/a/id_rsa", True),
    ("/a/id_rsa.pub", False), ("/a/b", False),
])
def test_anywhere_names_are_matched_on_the_last_segment(path: str, want: bool) -> None:
    """``**/N`` with wildcards in ``N``: the last segment alone is matched (no backtracking
    over the path); the answer is the per-glob regex's."""
    patterns = ["**/*.pem", "**/id_rs?", "~/**/x*"]
    gs = GlobSet(patterns, HOME, forbid=True)
    assert gs.names is not None
    assert gs.match(path) is want
    assert reference(patterns, path, True) is want
