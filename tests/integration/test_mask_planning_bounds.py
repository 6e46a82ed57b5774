"""Mask planning bounded (issue 32 items 4 and 11, issue 27 item 4): a tree planted from inside a
sandbox is never listed past ``MAX_DIR_ENTRIES`` and stays masked (fail closed), a second
workspace reuses the system trees' walk, and the caches stay within their bytes."""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc.executor import ProcExecutor
from plugins.executor_proc.spec import build_plan
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.sandbox import masks
from policy_engine.sandbox.masks import DirCache, plan_masks
from tests.integration.planted import planted_world
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

PATTERNS = ("/**/.env", "/**/credentials.json", "/etc/ssh/ssh_host_*_key")
PLANT = textwrap.dedent("""
    import os, sys
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    for i in range(int(sys.argv[2])):
        os.close(os.open(f"{d}/f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    print("planted")
""")
READ = textwrap.dedent("""
    import os, sys
    d = sys.argv[1]
    try:
        print("entries", len(os.listdir(d)))
    except OSError as e:
        print("list", e.errno)
    try:
        print("read", open(os.path.join(d, ".env")).read())
    except OSError as e:
        print("read", e.errno)
""")


@pytest.fixture
def world() -> Iterator[Path]:
    with planted_world("pe-maskbound-") as r:
        yield r


def _run(ex: ProcExecutor, root: Path, code: str, *args: str) -> dict[str, object]:
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 120)
    return ex.execute(ctx, ProcExecOp(tool="/usr/bin/python3", args=("-c", code, *args))).out


def test_a_tree_planted_from_inside_a_sandbox_is_masked_whole_not_listed(world: Path) -> None:
    """N5: 300k files under a writable path made every later plan list them. Planted here by
    a sandboxed call (MAX_DIR_ENTRIES + 500 files), with a host secret among them: the next
    plan lists at most MAX_DIR_ENTRIES names of it, masks it whole, the secret stays hidden,
    and the call after that lists nothing at all."""
    ex = ProcExecutor("bwrap")
    huge = world / "out" / "huge"
    try:
        out = _run(ex, world, PLANT, str(huge), str(masks.MAX_DIR_ENTRIES + 500))
        assert out["stdout"] == "planted\n", out
        (huge / ".env").write_text("TOKEN=planted-dir-secret")  # the host's, among them
        (huge / ".env").chmod(0o644)
        os.utime(huge)  # and a change the ctime cache must see (a new listing)
        before = masks.DEFAULT_CACHE.entries_listed
        out = _run(ex, world, READ, str(huge))
        first = masks.DEFAULT_CACHE.entries_listed - before
        out2 = _run(ex, world, READ, str(huge))
        second = masks.DEFAULT_CACHE.entries_listed - before - first
    finally:
        ex.close()
        shutil.rmtree(huge, ignore_errors=True)
    assert "planted-dir-secret" not in str(out["stdout"]), out
    assert "entries 0" in str(out["stdout"]), out  # an empty cover, not the planted names
    assert str(huge) in out["masked"], out["masked"]  # type: ignore[operator]
    assert first <= masks.MAX_DIR_ENTRIES + 1_000, first
    # nothing listed again while inotify has watches to give (past the user's
    # max_user_watches, shared with every other process of the user, every plan walks again)
    watcher = masks.DEFAULT_CACHE.watcher
    assert second == 0 or watcher is None or not watcher.usable, second
    assert "planted-dir-secret" not in str(out2["stdout"]), out2


def test_a_second_workspace_reuses_the_system_trees_walk(world: Path) -> None:
    """27.4: only the new workspace is walked; a secret in it is still found."""
    other = Path(tempfile.mkdtemp(prefix="pe-maskbound-b-", dir="/tmp"))
    (other / "sub").mkdir()
    (other / "sub" / ".env").write_text("B=secret")
    try:
        cache = DirCache()
        first = plan_masks([str(world)], ["/etc", "/usr"], PATTERNS, "/root", cache)
        assert first.dirs_listed > 100  # /usr and /etc were walked
        second = plan_masks([str(other)], ["/etc", "/usr"], PATTERNS, "/root", cache)
        assert second.dirs_listed <= 2, second.dirs_listed  # `other` and `other/sub` only
        assert str(other / "sub" / ".env") in second.files
        # a change in an unrelated tree re-walks nothing of these records (while inotify has
        # watches to give: past the user's max_user_watches, which the suite's planted trees
        # can reach, every plan walks again, the safe way)
        (world / "out" / "new").mkdir()
        third = plan_masks([str(other)], ["/etc", "/usr"], PATTERNS, "/root", cache)
        assert cache.watcher is not None
        assert third.dirs_listed == 0 or not cache.watcher.usable, third.dirs_listed
        assert str(other / "sub" / ".env") in third.files
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_the_caches_stay_within_their_bytes_over_many_distinct_binds(world: Path) -> None:
    """32.11: a service gives every exec its own artifacts directory: new walk keys each
    call. With a 2 MiB budget the cache holds at most that, however many plans ran, and
    still finds every secret."""
    for i in range(300):
        d = world / "tree" / f"d{i:03d}"
        d.mkdir(parents=True)
        for j in range(20):
            (d / f"file-with-a-longish-name-{j:02d}.txt").touch()
    (world / "tree" / "d150" / ".env").write_text("X=1")
    cache = DirCache(max_bytes=2 << 20)
    peak = 0
    for call in range(200):
        art = world / "out" / f"exec-{call:04d}"
        art.mkdir()
        plan = plan_masks([str(world), str(art)], [], PATTERNS, "/root", cache)
        assert str(world / "tree" / "d150" / ".env") in plan.files
        peak = max(peak, cache.held_bytes())
    assert peak <= 2 << 20, peak
    assert len(cache.walks) < 200  # old records went


def test_build_plan_plans_from_the_cache_after_warm_up(world: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor's start warms the system trees (``spec.prewarm``): the first call's plan
    lists only its own workspace."""
    import threading

    from plugins.executor_proc import spec
    # as a fresh engine starts: an empty cache (earlier tests' planted trees pushed the system
    # walk out of its byte budget) and no warm-up yet; the warm cache comes back after the test
    monkeypatch.setattr(masks, "DEFAULT_CACHE", DirCache())
    monkeypatch.setattr(spec, "_warming", [])
    monkeypatch.setattr(spec, "_warmed", threading.Event())
    spec.prewarm(wait=True)
    before = masks.DEFAULT_CACHE.entries_listed
    build_plan(make_profile(world), ProcExecOp(tool="true"))
    listed = masks.DEFAULT_CACHE.entries_listed - before
    assert listed < 200, listed  # the world's few entries, not /usr


def test_a_walk_past_its_directory_budget_is_refused_and_a_reuse_is_free(world: Path) -> None:
    """32.11: a bind of a whole host walked it all; past ``max_dirs`` the plan refuses
    (``spec.bounded_plan`` turns it into CAPABILITY_BLOCKED), a reused walk costs nothing."""
    for i in range(60):
        (world / "many" / f"d{i:02d}").mkdir(parents=True)
    cache = DirCache()
    with pytest.raises(masks.PlanTooLarge):
        plan_masks([str(world)], [], PATTERNS, "/root", cache, max_dirs=50)
    plan_masks([str(world)], [], PATTERNS, "/root", cache, max_dirs=500)
    if cache.watcher is not None and cache.watcher.usable:  # a reuse needs inotify's watches
        again = plan_masks([str(world)], [], PATTERNS, "/root", cache, max_dirs=5)  # reused
        assert again.dirs_listed == 0


def test_a_forked_worker_plans_without_the_parents_warm_up(world: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """`serve --workers` forks after the executor started its warm-up thread: a child has no
    such thread, so waiting for it would hang every process call (it did: the workers test's
    execs timed out). The child plans on its own, with a cache and inotify instance of its own."""
    import threading

    from plugins.executor_proc import spec
    monkeypatch.setattr(spec, "_warming", [])  # as in a fresh engine: no warm-up yet
    monkeypatch.setattr(spec, "_warmed", threading.Event())
    spec.prewarm()  # started, not waited for: the fork below comes while it walks
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            build_plan(make_profile(world), ProcExecOp(tool="true"))
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked worker's plan waited for the parent's warm-up thread")


def test_a_walk_larger_than_its_share_is_kept_for_the_next_plan(world: Path) -> None:
    """27.4: a bind of a whole host (``allowReadOutside``: ~73,000 directories on this host,
    a record of ≈ 19 MB against the walk records' 16 MB share) was evicted by its own
    insertion, so every call walked the whole host again (2 s of CPU each). The newest
    record stays, whatever its size (``MAX_PLAN_DIRS`` bounds it); the older ones go."""
    for i in range(400):
        (world / "many" / f"d{i:03d}").mkdir(parents=True)
    (world / "many" / "d399" / ".env").write_text("X=1")
    cache = DirCache(max_bytes=256 << 10)  # a 64 KiB share: the walk's record is ~110 KiB
    small = world / "out"
    plan_masks([str(small)], [], PATTERNS, "/root", cache)
    first = plan_masks([str(world)], [], PATTERNS, "/root", cache)
    assert first.dirs_listed > 400
    assert str(world / "many" / "d399" / ".env") in first.files
    again = plan_masks([str(world)], [], PATTERNS, "/root", cache)
    assert again.dirs_listed <= 2, again.dirs_listed  # reused: stamps checked, nothing listed
    assert str(world / "many" / "d399" / ".env") in again.files
    (world / "many" / "d007" / ".env").write_text("Y=1")  # a change is still seen
    third = plan_masks([str(world)], [], PATTERNS, "/root", cache)
    assert str(world / "many" / "d007" / ".env") in third.files
    assert third.dirs_listed <= 3, third.dirs_listed
    assert len(cache.walks) == 1  # the small one went: the share is what the rest may hold
