"""A pooled cgroup's kept read descriptors: the same values as reading by path, never a stale
one, closed with the group, and never inherited by a sandbox (real cgroups; needs root).

Each ``ExecCgroup`` the pool makes opens, on the pool's thread, the files a proc call reads
after its tool exits (``cgroup.procs``, the memory peak, the OOM counter, the CPU time) and
reads them with ``pread`` at offset 0 (plugins/executor_proc/cgroups.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc import cgroups
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

MiB = 1 << 20
# touches ``mib`` MiB, then burns ``ms`` ms of its own CPU (counted, not timed)
WORK = textwrap.dedent("""
    import sys, time
    mib, ms = int(sys.argv[1]), int(sys.argv[2])
    b = bytearray(mib << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    end = time.process_time() + ms / 1000
    while time.process_time() < end:
        pass
""")
# a bomb whose children leave the process tree (double fork) and whose loop refills the group
BOMB = "while :; do (sleep 60 &) ; done"


@pytest.fixture
def pool() -> Iterator[cgroups.CgroupPool]:
    p = cgroups.CgroupPool(1)
    assert p.version == "v1", "this host runs cgroup v1 as root; v2 is not testable here"
    yield p
    p.close()


def _join_and_exec(cg: cgroups.ExecCgroup, *argv: str) -> list[str]:
    """A shell that writes itself into every group of ``cg``, then execs ``argv``."""
    return ["/bin/sh", "-c", 'for f in $CG; do echo $$ > "$f"; done; exec "$@"', "sh", *argv]


def _env(cg: cgroups.ExecCgroup) -> dict[str, str]:
    return {**os.environ, "CG": " ".join(cg.procs_files)}


def _run_in(cg: cgroups.ExecCgroup, mib: int, ms: int) -> int:
    return subprocess.run(_join_and_exec(cg, sys.executable, "-c", WORK, str(mib), str(ms)),
                          env=_env(cg), check=False).returncode


def _members(cg: cgroups.ExecCgroup) -> list[int]:
    """``cg.pids()`` once a process has joined (bounded: a stale read must fail, not hang)."""
    for _ in range(500):
        if members := cg.pids():
            return members
        time.sleep(0.01)
    return []


def _by_path(cg: cgroups.ExecCgroup) -> cgroups.ExecCgroup:
    """The same directories without descriptors: every read opens the file by its path."""
    return cgroups.ExecCgroup(cg.version, dict(cg.dirs), cg.limits)


def _reads(cg: cgroups.ExecCgroup) -> tuple[int | None, int, int | None]:
    return cg.memory_peak(), cg.oom_kills(), cg.cpu_ms()


def test_kept_descriptors_read_what_the_files_say_and_never_a_stale_value(
        pool: cgroups.CgroupPool) -> None:
    cg = pool.acquire(64, 512 * MiB, 2.0)
    assert cg is not None
    try:
        assert {"procs", "peak", "oom", "cpu"} <= set(cg.fds), cg.fds
        assert _run_in(cg, 48, 60) == 0
        peak1, oom1, cpu1 = first = _reads(cg)
        assert first == _reads(_by_path(cg))
        assert peak1 is not None
        assert peak1 >= 48 * MiB
        assert cpu1 is not None
        assert cpu1 >= 60
        assert oom1 == 0
        # more in the same group: a read through the same descriptors sees the new state
        assert _run_in(cg, 160, 120) == 0
        peak2, oom2, cpu2 = second = _reads(cg)
        assert second == _reads(_by_path(cg))
        assert peak2 is not None
        assert peak2 >= 160 * MiB > peak1
        assert cpu2 is not None
        assert cpu2 >= cpu1 + 120
        assert oom2 == 0
    finally:
        pool.release(cg)


def test_an_oom_kill_is_counted_through_the_descriptor_each_time(
        pool: cgroups.CgroupPool) -> None:
    cg = pool.acquire(64, 32 * MiB, 1.0)
    assert cg is not None
    try:
        assert cg.oom_kills() == 0  # read once already: the next reads must not repeat it
        assert _run_in(cg, 256, 0) == -9
        assert cg.oom_kills() == 1 == _by_path(cg).oom_kills()
        assert _run_in(cg, 256, 0) == -9
        assert cg.oom_kills() == 2 == _by_path(cg).oom_kills()
    finally:
        pool.release(cg)


def test_the_member_list_is_read_anew_each_time(pool: cgroups.CgroupPool) -> None:
    cg = pool.acquire(64, 256 * MiB, 1.0)
    assert cg is not None
    sleeper = subprocess.Popen(_join_and_exec(cg, "sleep", "60"), env=_env(cg))
    try:
        # the kept cgroup.procs descriptor, opened before anyone joined, read after
        assert _members(cg) == [sleeper.pid]
        # a re-read of that descriptor would show the list v1 loaded at its first read (the
        # kernel keeps it for the file while it is read again within a second): later reads
        # must see the member leave
        sleeper.kill()
        sleeper.wait()
        assert cg.pids() == []
        second = subprocess.Popen(_join_and_exec(cg, "sleep", "60"), env=_env(cg))
        assert _members(cg) == [second.pid]
        assert cg.kill_all()
        second.wait()
        assert cg.pids() == [] == _by_path(cg).pids()
    finally:
        sleeper.kill()
        pool.release(cg)


def test_kill_all_empties_a_group_a_bomb_keeps_refilling(pool: cgroups.CgroupPool) -> None:
    cg = pool.acquire(48, 256 * MiB, 1.0)
    assert cg is not None
    try:
        bomb = subprocess.Popen(_join_and_exec(cg, "/bin/sh", "-c", BOMB), env=_env(cg),
                                stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(500):  # children that left the tree (double fork)
            if len(_by_path(cg).pids()) >= 20:
                break
            time.sleep(0.01)
        assert "procs" in cg.fds  # kill_all's first read goes through the descriptor
        assert cg.kill_all()
        bomb.wait()
        assert _by_path(cg).pids() == []
        assert cg.pids() == []
    finally:
        pool.release(cg)


def _settled(p: cgroups.CgroupPool) -> None:
    """Wait until the pool's thread has removed every released group and made its spare."""
    for _ in range(1000):
        with p._cond:
            if not p._dead and len(p._free) >= p.size:
                break
        time.sleep(0.01)
    time.sleep(cgroups.SETTLE_S * 5)  # the thread may still be in remove() of the last one


def _fds_into(groups: set[str]) -> list[str]:
    """This process's descriptors open on a file of one of ``groups`` (group directory names):
    counted by what they point at, not by how many the process has (other tests' pools and
    executors in the same worker open and close theirs meanwhile)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if any(f"/{g}/" in target for g in groups):
                found.append(target)
    return found


def _names(cg: cgroups.ExecCgroup) -> set[str]:
    return {os.path.basename(d) for d in cg.dirs.values()}


def test_no_descriptor_outlives_its_group_over_many_calls() -> None:
    p = cgroups.CgroupPool(2)
    used: set[str] = set()
    spares: set[str] = set()
    try:
        for _ in range(55):
            cg = p.acquire(64, 256 * MiB, 1.0)
            assert cg is not None
            assert cg.fds
            assert len(_fds_into(_names(cg))) == len(cg.fds)  # its own, all of them
            assert cg.pids() == []  # used as a call uses it (the procs descriptor read and closed)
            used |= _names(cg)
            p.release(cg)
        _settled(p)
        assert _fds_into(used) == []  # every released group's descriptors closed with it
        # a group removed directly (no pool thread) closes its descriptors too
        made = cgroups.create(64, 256 * MiB, 1.0)
        assert made is not None
        assert len(made.fds) == 4
        assert len(_fds_into(_names(made))) == 4
        made.remove()
        assert made.fds == {}
        assert _fds_into(_names(made)) == []
        with p._cond:
            spares = set().union(*(_names(g) for g in p._free))
        assert spares
        assert len(_fds_into(spares)) <= 4 * p.size  # only the spare groups' descriptors
    finally:
        p.close()
    assert _fds_into(spares) == []  # closing the pool closes the spares' too


def _cgroup_devices() -> set[int]:
    return {os.stat(os.path.join(cgroups.ROOT, c)).st_dev
            for c in ("pids", "memory", "cpu", "cpuacct")}


def _read_only_cgroup_fds(pid: int) -> list[str]:
    """The O_RDONLY descriptors of ``pid`` on a cgroup file system."""
    devs, out = _cgroup_devices(), []
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            st = os.stat(f"/proc/{pid}/fd/{n}")
            flags = next(int(line.split()[1], 8) for line in
                         Path(f"/proc/{pid}/fdinfo/{n}").read_text().splitlines()
                         if line.startswith("flags:"))
        except (OSError, StopIteration):
            continue
        if st.st_dev in devs and flags & os.O_ACCMODE == os.O_RDONLY:
            out.append(os.readlink(f"/proc/{pid}/fd/{n}"))
    return out


LIST_FDS = textwrap.dedent("""
    import os
    for n in sorted(os.listdir('/proc/self/fd'), key=int):
        try:
            st = os.fstat(int(n))
        except OSError:
            continue
        print(n, st.st_dev, st.st_ino)
""")


def test_no_sandbox_and_no_held_launcher_inherits_a_kept_descriptor(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    (root / "home").mkdir()
    ex = ProcExecutor("bwrap", ProcOptions(prespawn=2))
    try:
        devs = _cgroup_devices()
        for _ in range(3):  # held launchers, each in a fresh pooled group
            ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
            res = ex.execute(ctx, ProcExecOp(tool=sys.executable, args=("-c", LIST_FDS)))
            assert res.out["exit_code"] == 0, res.out
            seen = [line.split() for line in res.out["stdout"].splitlines()]
            assert seen
            assert [n for n, _, _ in seen][:3] == ["0", "1", "2"]
            assert [s for s in seen if int(s[1]) in devs] == []
        held = ex._held
        assert held is not None
        for _ in range(500):  # the pool's thread spawns them after the calls
            with held._cond:
                ready = list(held._ready)
            if ready:
                break
            time.sleep(0.01)
        assert ready
        assert all(h.cg is not None and h.cg.fds for h in ready)
        for h in ready:
            assert _read_only_cgroup_fds(h.proc.pid) == []
        assert _read_only_cgroup_fds(os.getpid())  # the engine does hold them: the check can see
    finally:
        ex.close()
