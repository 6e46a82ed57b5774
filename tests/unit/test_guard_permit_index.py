"""The guard's permit index (guard.permit_index) never leaves out a permit that admits the
resource, so the untraced scan decides as the full scan does; and the scale case it is for."""

from __future__ import annotations

import random

import pytest

from policy_engine.guard.matchers import FsMatcher, Matcher, ProcMatcher
from policy_engine.guard.permit_index import PermitIndex
from policy_engine.model import FsCapability, ProcCapability

HOME = "/home/agent"
SEGS = ["a", "b", "data", "t1", "t10", "x.txt", ".env", "out"]
GLOBS = ["/a/**", "/a/b", "/a/b/**", "/data/t1/**", "/data/t10", "~/**", "~/x.txt", "/**",
         "**/.env", "/a/*/out", "/", "/data/t?/**", "/a/b/x.txt", "relative/bad"]


def _paths(rng: random.Random, n: int) -> list[str]:
    out = ["/", HOME, HOME + "/x.txt"]
    for _ in range(n):
        out.append("/" + "/".join(rng.choice(SEGS) for _ in range(rng.randint(1, 4))))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_fs_candidates_hold_every_admitting_permit_in_order(seed: int) -> None:
    rng = random.Random(seed)
    members: list[tuple[Matcher, ...]] = []
    for _ in range(40):
        paths = tuple(rng.sample(GLOBS, rng.randint(1, 3)))
        first = FsMatcher(FsCapability(kind="fs.read", paths=paths), HOME, forbid=False)
        extra = FsMatcher(FsCapability(kind="fs.read", paths=("/**",)), HOME, forbid=False)
        members.append((first, extra) if rng.random() < 0.2 else (first,))
    index = PermitIndex("fs.read", members)
    for path in _paths(rng, 300):
        admitting = [i for i, ms in enumerate(members) if all(m.admits(path) for m in ms)]
        picks = index.candidates(path)
        assert picks is not None
        assert picks == sorted(set(picks)), path  # ascending, each once
        assert [i for i in picks if all(m.admits(path) for m in members[i])] == admitting, path


def test_proc_candidates_are_the_tools_permits() -> None:
    members: list[tuple[Matcher, ...]] = [
        (ProcMatcher(ProcCapability(tool=f"tool{i % 7}")),) for i in range(30)]
    index = PermitIndex("proc.exec", members)
    picks = index.candidates(("tool3", ()))
    assert picks == [i for i in range(30) if i % 7 == 3]
    assert index.candidates(("nope", ())) == []


def test_a_deny_scanning_thousands_of_read_permits_tests_none() -> None:
    members: list[tuple[Matcher, ...]] = [
        (FsMatcher(FsCapability(kind="fs.read", paths=(f"/data/t{i}/**",)), HOME,
                   forbid=False),) for i in range(5000)]
    index = PermitIndex("fs.read", members)
    assert index.candidates("/data/none/x") == []
    assert index.candidates("/data/t4999/a/b") == [4999]
