"""The mask walk's name-only match of `<prefix>/**/<segment>` globs (`**/*.pem`) agrees with the
whole glob matched against the whole path, for every directory at or beneath the prefix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policy_engine.sandbox.masks import DirCache, _compile, _frame, plan_masks

PATTERNS = ["**/*.pem", "**/id_*", "**/.*_history", "**/?x", "**/*[ab]*", "**/a*b*c",
            "/srv/data/**/*.key", "~/proj/**/*secret*", "**/*.tar.gz", "**/[!.]*rc"]
NAMES = ["x.pem", ".pem", "x.pem.bak", "id_rsa", "id_", "xid_rsa", ".bash_history",
         "bash_history", "ax", "x", "xx", "abc", "a.b.c", "aXbYc", "ab", "s.tar.gz", "tar.gz",
         "zshrc", ".zshrc", "rc", "new\nline.pem", "x.pem\n", "t\udcffx.pem", "ü.pem", "*",
         "[ab]", "mysecret", "secret"]
DIRS = ["/", "/srv/data", "/srv/data/a/b", "/root/proj", "/root/proj/deep/er", "/etc"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_name_only_match_agrees_with_the_whole_glob(pattern: str) -> None:
    g = _compile(pattern, "/root")
    assert g.leaf is not None, pattern  # every pattern here is a leaf glob
    leaf = re.compile(g.leaf, re.DOTALL)
    frame = _frame((g,), {})
    assert frame.leaves is not None
    assert frame.slow == ()
    checked = 0
    for d in DIRS:
        if not (d == g.prefix or d.startswith(g.prefix.rstrip("/") + "/")):
            continue  # a walk asks a glob only at or beneath its prefix
        for name in NAMES:
            whole = g.glob.matches(f"{d.rstrip('/')}/{name}")
            assert (leaf.match(name) is not None) == whole, (pattern, d, name)
            assert (frame.leaves.match(name) is not None) == whole, (pattern, d, name)
            checked += 1
    assert checked >= len(NAMES)


def test_names_and_paths_that_are_not_leaves_keep_their_own_match() -> None:
    for pattern in ("**/.env", "/etc/ssh/ssh_host_*_key", "**/a/*.pem", "/x/*/y/**/z*"):
        assert _compile(pattern, "/root").leaf is None, pattern


def test_a_plan_masks_what_the_leaf_globs_name(tmp_path: Path) -> None:
    """End to end: the walk finds every file a leaf glob names, beside exact names and
    path globs, and nothing else."""
    deep = tmp_path / "w" / "a" / "b"
    deep.mkdir(parents=True)
    want = {tmp_path / "w" / "top.pem", deep / "id_ed25519", deep / "k.pem", deep / ".env",
            tmp_path / "w" / "a" / "cfg" / "x.key"}
    (tmp_path / "w" / "a" / "cfg").mkdir()
    for f in [*want, deep / "notes.txt", deep / "pem", tmp_path / "w" / "a" / "x.key"]:
        f.write_text("s")
    plan = plan_masks([str(tmp_path / "w")], [], ["**/*.pem", "**/id_*", "**/.env",
                                                  f"{tmp_path}/w/*/cfg/*.key"],
                      "/root", DirCache())
    assert set(plan.files) == {str(p) for p in want}
