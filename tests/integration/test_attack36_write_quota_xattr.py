"""Attack 36: extended attributes put data on disk that the write quota does not count.

docs/operations.md ("Disk: a call's write quota"): everything a proc call writes to disk, every
file and process together, is bounded by its `disk_write_bytes`. An ext4 `user.*` attribute of
a few KiB takes its own disk block per file; the watchdog's `/proc/PID/io` `write_bytes` only
sees the inode and directory blocks, so a call lands many times its quota on disk.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.errors import PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.planted import planted_world
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

MiB = 1 << 20
QUOTA = 8 * MiB
FILES = 60_000  # ~240 MiB of attribute blocks if nothing stops it
WRITER = textwrap.dedent("""
    import os, sys
    where, count = sys.argv[1], int(sys.argv[2])
    value = b"x" * 4000  # over the inode's in-line room: one 4 KiB block per file
    for i in range(count):
        path = os.path.join(where, f"x{i}")
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.setxattr(path, "user.a", value)
    print("made", count)
""")


@pytest.fixture
def world() -> Iterator[Path]:
    with planted_world("pe-a36xattr-") as r:
        (r / "out" / "w").mkdir(parents=True, mode=0o777)
        yield r


def _on_disk(path: Path) -> int:
    # st_blocks counts an inode's external attribute block as well as its data
    return sum(p.stat().st_blocks * 512 for p in path.iterdir())


def test_attribute_blocks_count_against_the_write_quota(world: Path) -> None:
    probe = world / "out" / "probe"
    probe.touch()
    os.setxattr(probe, "user.a", b"x" * 4000)  # the file system takes user attributes
    probe.unlink()
    ex = ProcExecutor("bwrap", ProcOptions(max_file_bytes=MiB))
    assert ex.available() is True, ex.unavailable_reason
    try:
        profile = make_profile(world, disk_write_bytes=QUOTA)
        ctx = ExecContext(profile=profile, deadline=time.monotonic() + 120,
                          limits=profile.limits)
        op = ProcExecOp(tool="/usr/bin/python3",
                        args=("-c", WRITER, str(world / "out" / "w"), str(FILES)))
        try:
            out = ex.execute(ctx, op).out
            ended = f"ran to its end: exit {out['exit_code']}"
        except PolicyEngineError as exc:
            ended = f"refused: {exc}"
    finally:
        ex.close()
    # the same bound the data-file test holds the watchdog to (tests/integration/
    # test_disk_write_quota.py): killed near the quota, not many times past it
    landed = _on_disk(world / "out" / "w")
    assert landed < 6 * QUOTA, f"{landed / MiB:.0f} MiB on disk under an 8 MiB quota ({ended})"
