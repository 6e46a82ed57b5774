"""Attack 40 (outsider): the seccomp filter with its new number search (``seccomp._allow_unnamed``)
run by the real kernel inside the real proc-bwrap sandbox. A C probe (attack40_sysprobe.c,
beside this file) makes each denied call for real and the calls that must keep working; every
answer is checked against the documented errno, and the whole table is compared with the same
sandbox running the old linear program (``build_filter(fast=False)``): the kernel must answer
alike."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc import executor as proc_executor
from plugins.executor_proc import seccomp
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

SOURCE = Path(__file__).resolve().parent / "attack40_sysprobe.c"
EPERM, ENOSYS, EOPNOTSUPP, EAFNOSUPPORT = (errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP,
                                           errno.EAFNOSUPPORT)
# what docs/operations.md ("Mandatory denies inside the sandbox", layer 2) promises, network off
EXPECTED: dict[str, str] = {
    "mount": str(EPERM), "umount2": str(EPERM), "unshare_user": str(EPERM),
    "unshare_0": str(EPERM), "ptrace": str(EPERM), "bpf": str(EPERM),
    "io_uring_setup": str(EPERM), "open_tree": str(EPERM), "fsopen": str(EPERM),
    "setns": str(EPERM), "chroot": str(EPERM), "keyctl": str(EPERM),
    "userfaultfd": str(EPERM), "mount_setattr": str(EPERM),
    "clone_newuser": str(EPERM), "clone_newns_hi": str(EPERM), "clone_plain": "0",
    "clone3": str(ENOSYS), "openat2": str(ENOSYS), "openat_rdonly": "0",
    "openat_creat_0644": "0", "openat_creat_suid": str(EPERM), "open_creat_sgid": str(EPERM),
    "creat_suid": str(EPERM), "chmod_suid": str(EPERM), "chmod_0600": "0",
    "fchmod_suid": str(EPERM), "fchmodat_sgid": str(EPERM), "fchmodat2_suid": str(EPERM),
    "mknod_chr": str(EPERM), "mknodat_blk": str(EPERM), "mknod_fifo": "0",
    "socket_inet": str(EAFNOSUPPORT), "socket_inet6": str(EAFNOSUPPORT),
    "socket_unix": str(EPERM), "socketpair_dgram": str(EPERM), "socketpair_stream": "0",
    "bind": str(EPERM), "fallocate_keep": str(EOPNOTSUPP), "fallocate_zero": str(EOPNOTSUPP),
    "fallocate_0": "0", "setxattr": str(EOPNOTSUPP), "fsetxattr": str(EOPNOTSUPP),
    "lsetxattr": str(EOPNOTSUPP), "setxattrat": str(EOPNOTSUPP),
    "personality_norandom": str(EPERM), "personality_query": "0",
    "x32_getpid": str(EPERM), "nr_500_unknown": str(ENOSYS), "getpid": "0",
    "i386_getpid": "killed:31", "i386_mount": "killed:31",
}


@pytest.fixture(scope="module")
def executor() -> Iterator[ProcExecutor]:
    ex = ProcExecutor("bwrap")
    assert ex.available() is True, ex.unavailable_reason
    yield ex
    ex.close()


def _table(executor: ProcExecutor, root: Path, probe: Path) -> dict[str, str]:
    out = executor.execute(
        ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60),
        ProcExecOp(tool=str(probe), args=(str(root / "out"), *EXPECTED), cwd=str(root))).out
    assert out["exit_code"] == 0, out
    return dict(line.split("=", 1) for line in out["stdout"].splitlines() if "=" in line)


@pytest.fixture
def root(tmp_path: Path) -> tuple[Path, Path]:
    r = tmp_path / "root"
    for d in ("out", "home", "tmp", "bin"):
        (r / d).mkdir(parents=True)
    probe = r / "bin" / "sysprobe"
    subprocess.run(["gcc", "-O1", "-o", str(probe), str(SOURCE)], check=True)
    return r, probe


def test_every_denied_call_is_refused_with_its_errno_by_the_real_kernel(
        executor: ProcExecutor, root: tuple[Path, Path]) -> None:
    got = _table(executor, *root)
    assert got == EXPECTED, {k: (got.get(k), v) for k, v in EXPECTED.items() if got.get(k) != v}


def test_the_kernel_answers_the_search_and_the_linear_program_alike(
        executor: ProcExecutor, root: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _table(executor, *root)
    for p in (root[0] / "out").iterdir():
        p.unlink()

    used = [0]

    def linear(deny_inet: bool, deny_setsid: bool, deny_unix: bool, deny_bind: bool) -> str:
        used[0] += 1
        return seccomp.build_filter(deny_inet=deny_inet, deny_setsid=deny_setsid,
                                    deny_unix=deny_unix, deny_bind=deny_bind, fast=False).hex()

    monkeypatch.setattr(proc_executor, "_filter_hex", linear)
    slow = _table(executor, *root)
    assert used[0] >= 1  # the sandbox was given the linear program
    assert fast == slow
