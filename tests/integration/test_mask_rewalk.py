"""A partial re-walk (a changed directory listed again, its unchanged subdirectories kept)
masks what a fresh walk masks, whatever the change: differential, over seeded random changes,
through inotify, through stamps alone, and through a walk stored and loaded (listing_store)."""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest

from policy_engine.sandbox import listing_store
from policy_engine.sandbox.masks import RACY_NS, DirCache, MaskPlan, plan_masks

PATTERNS = ("/**/.env", "/**/credentials.json", "/**/secrets.json")


def fresh(tree: Path) -> MaskPlan:
    return plan_masks([], [str(tree)], PATTERNS, "/nonexistent", DirCache(watch=False))


def make_tree(root: Path, rng: random.Random) -> list[Path]:
    dirs = [root]
    for i in range(120):
        d = rng.choice(dirs) / f"d{i}"
        d.mkdir()
        dirs.append(d)
        if rng.random() < 0.1:
            (d / ".env").write_text("X=1")
        (d / "file.txt").write_text("x")
    return dirs


def mutate(root: Path, outside: Path, rng: random.Random, step: int) -> str:
    dirs = [Path(p) for p, _, _ in os.walk(root)]
    d = rng.choice(dirs)
    kind = rng.choice(["new-dir-with-secret", "secret", "unsecret", "rmtree", "rename",
                       "secret-dir", "move-in", "replace-with-file"])
    if kind == "new-dir-with-secret":
        (d / f"n{step}" / "deep").mkdir(parents=True)
        (d / f"n{step}" / "deep" / "credentials.json").write_text("{}")
    elif kind == "secret":
        (d / ".env").write_text("X=2")
    elif kind == "unsecret":
        for p in d.glob(".env"):
            if p.is_file():
                p.unlink()
    elif kind == "rmtree" and d != root:
        shutil.rmtree(d)
    elif kind == "rename" and d != root:
        target = rng.choice([p for p in dirs if not p.is_relative_to(d)])
        d.rename(target / f"r{step}")
    elif kind == "secret-dir":
        (d / ".env").mkdir(exist_ok=True) if not (d / ".env").is_file() else None
    elif kind == "move-in":
        src = outside / f"m{step}"
        (src / "a").mkdir(parents=True)
        (src / "a" / "secrets.json").write_text("{}")
        src.rename(d / f"m{step}")
    elif kind == "replace-with-file" and d != root:
        shutil.rmtree(d)
        d.write_text("now a file")
    return kind


@pytest.mark.parametrize("mode", ["inotify", "stamps", "stored"])
def test_a_partial_rewalk_masks_what_a_fresh_walk_masks(tmp_path: Path, mode: str) -> None:
    rng = random.Random(27)
    root, outside, state = tmp_path / "tree", tmp_path / "outside", tmp_path / "state"
    root.mkdir()
    outside.mkdir()
    state.mkdir(mode=0o700)
    make_tree(root, rng)
    store = str(state / "walks.bin")
    cache = DirCache(watch=mode == "inotify")
    first = plan_masks([], [str(root)], PATTERNS, "/nonexistent", cache)
    assert first.files == fresh(root).files
    for step in range(60):
        kind = mutate(root, outside, rng, step)
        if mode == "stored":  # a restart: the walk stored, loaded by a new process's cache
            listing_store.save(cache, [str(root)], store, force=True)
            cache = DirCache()
            assert listing_store.load(cache, store, watch=step % 2 == 0) > 0
            if step % 2:
                listing_store.watch_loaded(cache)
        got = plan_masks([], [str(root)], PATTERNS, "/nonexistent", cache)
        want = fresh(root)
        assert (got.files, got.dirs) == (want.files, want.dirs), (step, kind)
        assert got.dirs_visited == want.dirs_visited, (step, kind)


def test_an_unchanged_stored_walk_lists_nothing_and_a_new_secret_lists_one_directory(
        tmp_path: Path) -> None:
    rng = random.Random(3)
    root, state = tmp_path / "tree", tmp_path / "state"
    root.mkdir()
    state.mkdir(mode=0o700)
    dirs = make_tree(root, rng)
    time.sleep(RACY_NS / 1e9 + 0.2)  # older than the racy window, as a system tree is
    cache = DirCache()
    plan_masks([], [str(root)], PATTERNS, "/nonexistent", cache)
    store = str(state / "walks.bin")
    assert listing_store.save(cache, [str(root)], store) == len(dirs)
    again = DirCache()
    assert listing_store.load(again, store) == len(dirs)
    plan = plan_masks([], [str(root)], PATTERNS, "/nonexistent", again)
    assert plan.files == fresh(root).files
    assert plan.dirs_listed == 0
    assert again.entries_listed == 0
    target = dirs[77]
    (target / ".env").write_text("planted")
    third = DirCache()
    listing_store.load(third, store, watch=False)
    listing_store.watch_loaded(third)
    plan = plan_masks([], [str(root)], PATTERNS, "/nonexistent", third)
    assert str(target / ".env") in plan.files
    assert plan.dirs_listed == 1  # that directory alone


def test_a_change_between_the_first_check_and_the_watches_is_seen(tmp_path: Path) -> None:
    """The start's order (spec.prewarm): stamps checked without watches, the first plan, then
    the watches with a second check; a secret planted between the two checks is masked by the
    next plan, and one planted after the watches by the plan after it."""
    rng = random.Random(5)
    root, state = tmp_path / "tree", tmp_path / "state"
    root.mkdir()
    state.mkdir(mode=0o700)
    dirs = make_tree(root, rng)
    time.sleep(RACY_NS / 1e9 + 0.2)
    cache = DirCache()
    plan_masks([], [str(root)], PATTERNS, "/nonexistent", cache)
    store = str(state / "walks.bin")
    listing_store.save(cache, [str(root)], store)
    again = DirCache()
    listing_store.load(again, store, watch=False)  # the first check
    first = plan_masks([], [str(root)], PATTERNS, "/nonexistent", again)
    assert first.files == fresh(root).files
    between = dirs[40] / ".env"
    between.write_text("planted between the checks")
    assert listing_store.watch_loaded(again) == 1  # the second check, each directory watched
    second = plan_masks([], [str(root)], PATTERNS, "/nonexistent", again)
    assert str(between) in second.files
    after = dirs[90] / "credentials.json"
    after.write_text("{}")
    third = plan_masks([], [str(root)], PATTERNS, "/nonexistent", again)
    assert str(after) in third.files
    # that directory, seen by its watch; without a watch (past max_user_watches, shared by every
    # process of the uid) also the one listed just before, whose racy stamp vouches for nothing
    assert third.dirs_listed == (1 if again.watcher is not None and again.watcher.usable else 2)
