"""A proc call's mask plan kept between calls (``policy_engine/sandbox/plancache.py``, issue 27
item 4) is reused only while nothing it was computed from changed: a secret planted in a bound
tree, in a new directory, a second name given to a bound file outside every bind, or a home
re-pointed after the plan was kept all reach the next plan, and the first one inside the
sandbox. Real files, real inotify, real bwrap."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_proc import spec
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.guard.binds import bound_paths
from policy_engine.model import ProcExecOp, Profile
from policy_engine.sandbox import masks, plancache
from tests.integration.test_proc_sandbox import fs_cap, make_profile

pytestmark = pytest.mark.integration


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many plans were computed (``plan_masks`` ran) rather than reused."""
    calls = [0]
    real = spec.plan_masks

    def counting(*args: Any, **kw: Any) -> masks.MaskPlan:
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(spec, "plan_masks", counting)
    return calls


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    for d in ("out", "home/.ssh", "src/pkg"):
        (r / d).mkdir(parents=True)
    (r / "src" / "pkg" / "main.py").write_text("print(1)\n")
    return r


def settle() -> None:
    """Past RACY_NS, so a plan's listings are the settled ones."""
    time.sleep(masks.RACY_NS / 1e9 + 0.05)


def watching() -> bool:
    """Whether the mask watcher works in this process: a plan is reused only then. Past
    ``fs.inotify.max_user_watches`` (other engines of the uid hold them) it never is."""
    watcher = masks.DEFAULT_CACHE.watcher
    return watcher is not None and watcher.usable and plancache.cache().usable


def masked(profile: Profile) -> list[str]:
    """The call's masks (``spec._masks``, the function that keeps plans), over the profile's
    binds only: no system tree, so the test needs a few watches, not 26,000."""
    readable, writable = bound_paths(profile)
    files, dirs, _ = spec._masks(profile, readable + writable, [], keep=readable + writable)
    return files + dirs


def reused(profile: Profile, planned: list[int]) -> list[str]:
    """Plan until the plan is kept (the first adds its watches, the second is kept), then
    once more: a reuse, while the watcher works; else computed every time."""
    for _ in range(3):
        masked(profile)
    return kept(profile, planned)


def kept(profile: Profile, planned: list[int], *, then: Callable[[], None] = lambda: None,
         ) -> list[str]:
    """Plan once after ``then()`` and assert the plan was reused (computed, without a watcher).
    A change of the host's mount table ends every kept plan, rightly: other tests running
    beside this one (containers, FUSE, staged binds) make such changes, so a plan computed
    again while the table changed is tried again (after planning until kept), never counted
    as a pass."""
    for _ in range(5):
        mounts = plancache.cache().mounts
        before = planned[0]
        then()
        plan = masked(profile)
        if planned[0] == before or plancache.cache().mounts == mounts or not watching():
            break
        for _ in range(2):  # computed for the mount table: keep it again, then look again
            masked(profile)
    assert planned[0] == (before if watching() else before + 1)
    return plan


def next_plan(profile: Profile, planned: list[int]) -> list[str]:
    before = planned[0]
    plan = masked(profile)
    assert planned[0] == before + 1, "a change the plan depends on did not end its reuse"
    return plan


def test_a_secret_planted_after_the_plan_was_kept_is_masked(root: Path,
                                                            planned: list[int]) -> None:
    profile = make_profile(root)
    settle()
    assert not [f for f in reused(profile, planned) if f.endswith(".env")]
    (root / "src" / "pkg" / ".env").write_text("TOKEN=planted")
    assert str(root / "src" / "pkg" / ".env") in next_plan(profile, planned)
    reused(profile, planned)
    deep = root / "new" / "deeper"
    deep.mkdir(parents=True)
    (deep / ".env").write_text("TOKEN=deeper")
    assert str(deep / ".env") in next_plan(profile, planned)


def test_a_change_elsewhere_keeps_the_plan(root: Path, tmp_path: Path,
                                           planned: list[int]) -> None:
    """A new file beside the tree's ancestors (every other user's file in /tmp) is no
    change the plan depends on."""
    profile = make_profile(root)
    settle()
    reused(profile, planned)
    kept(profile, planned, then=lambda: (tmp_path / f"unrelated-{time.monotonic_ns()}.txt")
         .write_text("x"))


def test_a_change_in_another_walked_workspace_keeps_the_plan(tmp_path: Path,
                                                           planned: list[int]) -> None:
    """The mask watcher logs every watched tree's changes; only those beneath the roots a plan
    walked end its reuse (a service's other workspaces churn all the time)."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    for r in (mine, other):
        for d in ("out", "home", "src"):
            (r / d).mkdir(parents=True)
    settle()
    masked(make_profile(other))  # walked, so watched by the mask watcher
    profile = make_profile(mine)
    reused(profile, planned)
    theirs = other / "src" / ".env"
    assert str(theirs) not in kept(profile, planned, then=lambda: theirs.write_text("T=theirs"))
    assert str(other / "src" / ".env") in masked(make_profile(other))


def test_a_second_name_for_a_bound_file_outside_every_bind_ends_the_reuse(
        root: Path, tmp_path: Path, planned: list[int]) -> None:
    """A file bind with another name could be a secret's (outsider round 6, F05): its link
    count is read outside any walk, so the reuse watches its directory for it."""
    notes = root / "src" / "notes.txt"
    notes.write_text("notes")
    base = make_profile(root)
    profile = base.model_copy(update={"capabilities": (fs_cap("fs.read", str(notes)),
                                                       fs_cap("fs.write", f"{root}/out/**"))})
    settle()
    assert str(notes) not in reused(profile, planned)
    os.link(notes, tmp_path / "elsewhere.txt")
    assert str(notes) in next_plan(profile, planned)


def test_a_home_repointed_after_the_plan_was_kept_masks_the_new_keys(
        tmp_path: Path, planned: list[int]) -> None:
    root = tmp_path / "root"
    for d in ("out", "h1/.ssh", "h2/.ssh"):
        (root / d).mkdir(parents=True)
    (root / "h1" / ".ssh" / "id_rsa").write_text("key one")
    (root / "h2" / ".ssh" / "id_rsa").write_text("key two")
    (root / "home").symlink_to(root / "h1")
    profile = make_profile(root)
    settle()
    assert str(root / "h1" / ".ssh") in reused(profile, planned)
    (root / "home.new").symlink_to(root / "h2")
    os.replace(root / "home.new", root / "home")
    assert str(root / "h2" / ".ssh") in next_plan(profile, planned)


@pytest.fixture(scope="module")
def executor() -> Iterator[ProcExecutor]:
    ex = ProcExecutor("bwrap")
    assert ex.available() is True, ex.unavailable_reason
    yield ex
    ex.close()


def test_in_the_sandbox_a_secret_planted_between_kept_plans_is_unreadable(
        executor: ProcExecutor, root: Path) -> None:
    profile = make_profile(root)
    target = root / "src" / "pkg" / ".env"
    run: Callable[[], dict[str, Any]] = lambda: executor.execute(  # noqa: E731
        ExecContext(profile=profile, deadline=time.monotonic() + 60),
        ProcExecOp(tool="cat", args=(str(target),), cwd=str(root))).out
    settle()
    # kept after the second call (reused while no tree it walks changed: the system trees'
    # changes count too, so how many were reused depends on the host; test_plan_reuse's
    # other tests count them over the binds alone)
    for _ in range(4):
        assert run()["exit_code"] != 0  # not there yet
    target.write_text("TOKEN=planted-between-calls")
    out = run()
    assert "planted-between-calls" not in out["stdout"], out
    # masked (bound over, then refused to the tool), not missing: the plan named it
    assert out["exit_code"] != 0, out
    assert "Permission denied" in out["stderr"], out


def test_past_its_bounds_the_cache_starts_over_and_still_masks(
        root: Path, planned: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A service binding a new workspace per call adds names to watch each time: past
    ``MAX_NAMES`` the cache is replaced by an empty one (new inotify instance), not grown."""
    monkeypatch.setattr(plancache, "MAX_NAMES", 5)
    first = plancache.cache()
    profile = make_profile(root)
    settle()
    for _ in range(3):
        masked(profile)
    assert (plancache.cache() is not first) == watching()
    assert not first.usable or not watching()
    (root / "src" / ".env").write_text("TOKEN=after-the-reset")
    assert str(root / "src" / ".env") in masked(profile)


def test_a_mount_in_a_bound_tree_ends_the_reuse_and_its_unmount_too(
        root: Path, planned: list[int]) -> None:
    """A mount changes what a path shows without any inotify event: the mount table is
    polled. (Run as root, as the engine's sandbox-uid mode is.)"""
    assert os.geteuid() == 0, "mounting needs root (the suite runs as root here)"
    profile = make_profile(root)
    settle()
    reused(profile, planned)
    where = root / "src" / "pkg"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "pe-test", str(where)], check=True)
    try:
        before = planned[0]
        masked(profile)
        assert planned[0] == before + 1
    finally:
        subprocess.run(["umount", str(where)], check=True)
    before = planned[0]
    masked(profile)
    assert planned[0] == before + 1
