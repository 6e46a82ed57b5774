"""A literal path glob admits that path only: not the same name with a trailing newline.

Python's ``$`` also matches before a final ``\\n``, so a glob compiled to ``^...$`` admitted
``/workspace/notes.txt\\n`` — a different file — wherever ``/workspace/notes.txt`` was permitted
(found while writing the macOS profile generator, whose property test used ``fullmatch``).
"""

from __future__ import annotations

from policy_engine.guard import Guard
from policy_engine.guard.globset import GlobSet
from policy_engine.guard.matchers import path_regex
from policy_engine.model import FsReadOp, FsWriteOp
from policy_engine.patterns.paths import PathGlob
from tests.unit.guard_fixtures import NOW, fs, make_profile, permit

HOME = "/home/agent"


def test_a_path_glob_does_not_match_its_path_plus_a_newline() -> None:
    assert PathGlob.of("/workspace/notes.txt").matches("/workspace/notes.txt")
    assert not PathGlob.of("/workspace/notes.txt").matches("/workspace/notes.txt\n")
    assert not PathGlob.of("/workspace/*.txt").matches("/workspace/a.txt\n")


def test_the_guard_matchers_do_not_match_a_trailing_newline() -> None:
    rx = path_regex(["/workspace/notes.txt"], HOME, forbid=False)
    assert rx.match("/workspace/notes.txt") is not None
    assert rx.match("/workspace/notes.txt\n") is None
    gs = GlobSet(["/workspace/notes.txt", "/workspace/b/*.txt"], HOME, forbid=False)
    assert gs.match("/workspace/notes.txt")
    assert not gs.match("/workspace/notes.txt\n")
    assert gs.match("/workspace/b/x.txt")
    assert not gs.match("/workspace/b/x.txt\n")
    # a name that merely contains a newline is still a name `*` matches
    assert GlobSet(["/workspace/b/*"], HOME, forbid=False).match("/workspace/b/x\n")


def test_a_literal_write_permit_does_not_allow_the_newline_twin() -> None:
    profile = make_profile(capabilities=(
        permit("fs.write", fs("fs.write", "/workspace/notes.txt")),
        permit("fs.read", fs("fs.read", "/workspace/notes.txt")),
    ))
    guard = Guard()
    assert guard.decide(profile, FsWriteOp(path="/workspace/notes.txt"), now_ms=NOW).allowed
    twin = guard.decide(profile, FsWriteOp(path="/workspace/notes.txt\n"), now_ms=NOW)
    assert not twin.allowed, twin
    assert not guard.decide(profile, FsReadOp(path="/workspace/notes.txt\n"), now_ms=NOW).allowed
