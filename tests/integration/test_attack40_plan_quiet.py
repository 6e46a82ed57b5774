"""Attack 40 (outsider): a kept mask plan is now reused after one ``poll(2)`` says nothing is
pending (``PlanCache._quiet``: its own inotify queue, the mask watcher's, /proc/self/mountinfo).
Each attempt plants a secret between two calls in a way aimed at that check — concurrent calls
while secrets land, a mount moved in already holding a secret, a mount made and gone between
calls, a renamed-in directory, a queue overflow, a fork — and then asks the real proc-bwrap
sandbox to read it. Real files, real inotify, real mounts (root), real bwrap."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp, Profile
from policy_engine.sandbox import masks, plancache
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def executor() -> Iterator[ProcExecutor]:
    ex = ProcExecutor("bwrap")
    assert ex.available() is True, ex.unavailable_reason
    yield ex
    ex.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    for d in ("out", "home/.ssh", "tmp", "src/pkg"):
        (r / d).mkdir(parents=True)
    (r / "src" / "pkg" / "main.py").write_text("print(1)\n")
    return r


def sh(executor: ProcExecutor, profile: Profile, root: Path, script: str) -> dict[str, Any]:
    return executor.execute(ExecContext(profile=profile, deadline=time.monotonic() + 60),
                            ProcExecOp(tool="sh", args=("-c", script), cwd=str(root))).out


def warm(executor: ProcExecutor, profile: Profile, root: Path) -> None:
    """Past RACY_NS, then plan until kept (the first adds watches, the second is kept)."""
    time.sleep(masks.RACY_NS / 1e9 + 0.05)
    for _ in range(4):
        sh(executor, profile, root, "true")


def reads(executor: ProcExecutor, profile: Profile, root: Path, path: Path) -> str:
    out = sh(executor, profile, root, f"cat '{path}' 2>&1; true")
    return str(out["stdout"])


def test_concurrent_calls_never_read_a_secret_planted_before_they_started(
        executor: ProcExecutor, root: Path) -> None:
    """A server's concurrent calls share the plan cache; secrets land in new directories
    while they run. A call that started after a secret was written must not read it."""
    profile = make_profile(root)
    warm(executor, profile, root)
    planted: dict[int, float] = {}
    seen: list[tuple[float, str]] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            out = sh(executor, profile, root, f"cat {root}/src/*/.env {root}/src/*/*/.env "
                                              f"2>/dev/null; true")
            seen.append((t0, str(out["stdout"])))

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(40):
            d = root / "src" / f"d{i}"
            if i % 2:  # a directory made elsewhere and renamed in, secret inside
                staged = root.parent / f"staged{i}"
                (staged / "deep").mkdir(parents=True)
                (staged / "deep" / ".env").write_text(f"SECRET-{i}-END")
                os.rename(staged, d)
            else:
                d.mkdir()
                (d / ".env").write_text(f"SECRET-{i}-END")
            planted[i] = time.monotonic()
            time.sleep(0.03)
    finally:
        stop.set()
        for t in threads:
            t.join()
    leaks = [(i, t0 - at) for t0, out in seen for i, at in planted.items()
             if at < t0 and f"SECRET-{i}-END" in out]
    assert len(seen) > 20
    assert not leaks, leaks


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def test_a_mount_moved_in_already_holding_a_secret_is_masked(
        executor: ProcExecutor, root: Path, tmp_path: Path) -> None:
    """No inotify event at all: a tmpfs filled elsewhere, then ``mount --move``d onto a bound
    directory of a kept plan; only the mount table tells."""
    assert os.geteuid() == 0, "mounting needs root (the suite runs as root here)"
    profile = make_profile(root)
    stage = tmp_path / "stage"
    stage.mkdir()
    target = root / "src" / "pkg"
    _mount("-t", "tmpfs", "-o", "size=64k", "pe-a40", str(stage))
    moved = False
    try:
        (stage / ".env").write_text("MOVED-SECRET")
        _mount("--make-private", str(stage))
        warm(executor, profile, root)
        assert "print(1)" in reads(executor, profile, root, target / "main.py")
        _mount("--move", str(stage), str(target))
        moved = True
        got = reads(executor, profile, root, target / ".env")
        assert "MOVED-SECRET" not in got, got
        # and again, the plan kept now
        got = reads(executor, profile, root, target / ".env")
        assert "MOVED-SECRET" not in got, got
    finally:
        subprocess.run(["umount", str(target if moved else stage)], check=True)


def test_a_bind_mount_made_and_gone_between_calls_then_remade(
        executor: ProcExecutor, root: Path, tmp_path: Path) -> None:
    """A secret-holding bind mount made, then gone, then made again: each state's call must
    mask what it shows (the mount table polled by two pollers on one descriptor)."""
    assert os.geteuid() == 0
    profile = make_profile(root)
    src = tmp_path / "secrets"
    src.mkdir()
    (src / ".env").write_text("BOUND-SECRET")
    target = root / "src" / "pkg"
    warm(executor, profile, root)
    for _ in range(3):
        _mount("--bind", str(src), str(target))
        try:
            for _ in range(3):
                got = reads(executor, profile, root, target / ".env")
                assert "BOUND-SECRET" not in got, got
        finally:
            subprocess.run(["umount", str(target)], check=True)
        for _ in range(2):
            sh(executor, profile, root, "true")


def test_a_queue_overflow_between_calls_still_masks(executor: ProcExecutor, root: Path) -> None:
    """More events than ``fs.inotify.max_queued_events`` between two calls: the overflow
    event must make the poll ready (and the drains invalidate)."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    profile = make_profile(root)
    warm(executor, profile, root)
    churn = root / "src" / "pkg"
    for i in range(limit + 500):
        (churn / f"f{i}").touch()
    (churn / ".env").write_text("OVERFLOW-SECRET")
    got = reads(executor, profile, root, churn / ".env")
    assert "OVERFLOW-SECRET" not in got, got


def test_a_forked_child_planning_leaves_the_parent_masking(
        executor: ProcExecutor, root: Path) -> None:
    """A fork shares the inotify queues: the child's calls must not swallow the events the
    parent's next call depends on."""
    profile = make_profile(root)
    warm(executor, profile, root)
    pid = os.fork()
    if pid == 0:  # the child: plants, then plans and runs (reads the shared queues if any)
        ex = ProcExecutor("bwrap")
        try:
            (root / "src" / "pkg" / ".env").write_text("FORK-SECRET")
            for _ in range(3):
                sh(ex, profile, root, "true")
        finally:
            ex.close()  # its id-mapped binds: never left behind
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    got = reads(executor, profile, root, root / "src" / "pkg" / ".env")
    assert "FORK-SECRET" not in got, got
    assert "Permission denied" in got, got  # masked, not missing


def test_a_secret_written_into_a_tmpfs_mounted_after_the_plan_was_kept_is_masked(
        executor: ProcExecutor, root: Path) -> None:
    """The plainest form: a tmpfs mounted over a walked directory, one call made (the mount
    table changed: the plan is computed again), then a secret written into the new mount."""
    assert os.geteuid() == 0
    profile = make_profile(root)
    target = root / "src" / "pkg"
    warm(executor, profile, root)
    _mount("-t", "tmpfs", "-o", "size=64k", "pe-a40b", str(target))
    try:
        sh(executor, profile, root, "true")
        (target / ".env").write_text("TMPFS-SECRET")
        got = reads(executor, profile, root, target / ".env")
        assert "TMPFS-SECRET" not in got, got
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_a_fuse_bindfs_mount_over_a_walked_directory_is_masked(
        executor: ProcExecutor, root: Path, tmp_path: Path) -> None:
    """FUSE (``bindfs``: fusermount lets any user mount on a directory they own) shows another
    tree's secret at a walked directory of a kept plan."""
    profile = make_profile(root)
    src = tmp_path / "fuse-src"
    src.mkdir()
    (src / ".env").write_text("FUSE-SECRET")
    target = root / "src" / "pkg"
    warm(executor, profile, root)
    subprocess.run(["bindfs", "-o", "nonempty", str(src), str(target)], check=True)
    try:
        got = reads(executor, profile, root, target / ".env")
        assert "FUSE-SECRET" not in got, got
    finally:
        subprocess.run(["fusermount", "-u", str(target)], check=True)


def test_many_concurrent_plans_never_miss_a_secret_planted_before_they_began(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan-level race at a higher rate than the sandbox allows: three threads plan the same
    profile (and one another workspace, so the mask watcher is drained by walks meanwhile)
    while secrets land; every plan begun after a secret was written must name it."""
    from tests.integration.test_plan_reuse import masked
    roots = []
    for name in ("mine", "other"):
        r = tmp_path / name
        for d in ("out", "home", "tmp", "src"):
            (r / d).mkdir(parents=True)
        roots.append(r)
    mine, other = (make_profile(r) for r in roots)
    time.sleep(masks.RACY_NS / 1e9 + 0.05)
    for _ in range(3):
        masked(mine)
        masked(other)
    quiet = [0, 0]
    real_quiet = plancache.PlanCache._quiet

    def counting(self: plancache.PlanCache, watcher: Any) -> bool:
        answer = real_quiet(self, watcher)
        quiet[answer] += 1
        return answer

    monkeypatch.setattr(plancache.PlanCache, "_quiet", counting)
    planted: dict[str, float] = {}
    misses: list[tuple[str, float]] = []
    stop = threading.Event()
    count = [0]

    def planner(profile: Profile, check: bool) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            plan = set(masked(profile))
            count[0] += 1
            if check:
                misses.extend((p, t0 - at) for p, at in list(planted.items())
                              if at < t0 and p not in plan)

    threads = [threading.Thread(target=planner, args=(mine, True)) for _ in range(3)]
    threads.append(threading.Thread(target=planner, args=(other, False)))
    for t in threads:
        t.start()
    try:
        for i in range(150):
            new = roots[0] / "src" / f"d{i % 7}" / f"e{i}"
            new.mkdir(parents=True)
            (new / ".env").write_text("S")
            planted[str(new / ".env")] = time.monotonic()
            (roots[1] / "src" / f"churn{i}").mkdir()
            time.sleep(0.005)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert count[0] > 100
    assert quiet[1] > 0, quiet  # the poll said "quiet" (the new path) ...
    assert quiet[0] > 0, quiet  # ... and "pending"
    assert not misses, misses[:5]


def test_a_directory_exchanged_in_with_a_secret_is_masked(
        executor: ProcExecutor, root: Path, tmp_path: Path) -> None:
    """``renameat2(RENAME_EXCHANGE)`` swaps a walked directory with one from outside every bind
    that holds a secret (one atomic step, both names existing throughout), then a symlink to
    the secret is planted beside it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    profile = make_profile(root)
    staged = tmp_path / "staged"
    (staged / "sub").mkdir(parents=True)
    (staged / "sub" / ".env").write_text("SWAPPED-SECRET")
    warm(executor, profile, root)
    target = root / "src" / "pkg"
    at_fdcwd, rename_exchange = -100, 2
    assert libc.renameat2(at_fdcwd, os.fsencode(staged), at_fdcwd, os.fsencode(target),
                          rename_exchange) == 0, ctypes.get_errno()
    got = reads(executor, profile, root, target / "sub" / ".env")
    assert "SWAPPED-SECRET" not in got, got
    (root / "src" / "link").symlink_to(target / "sub")
    got = reads(executor, profile, root, root / "src" / "link" / ".env")
    assert "SWAPPED-SECRET" not in got, got
