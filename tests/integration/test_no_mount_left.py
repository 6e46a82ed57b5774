"""The suite's guard against mounts left behind (tests/conftest.py): a test file that leaves a
mount over one of its temporary paths in the host's mount namespace fails, naming the mount; one
that removes its mount before it ends passes.

Why it matters: an id-mapped bind of a session workspace with a mask on its ``.env``, never
detached, made pytest's clean-up of an old run fail with "Device or resource busy" on that
``.env`` (plugins/executor_proc/idmap.py; the cause was fixed with one ``IDMAP_DIR`` mount per
host, 2026-11-29); the guard names the file that leaves one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
LEAVES = """
import subprocess


def test_mounts_a_tmpfs_and_leaves_it(tmp_path):
    (tmp_path / "m").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(tmp_path / "m")],
                   check=True)
"""
CLEANS = LEAVES + """    subprocess.run(["umount", str(tmp_path / "m")], check=True)
"""


def _conftest() -> str:
    """The suite's conftest, its wait for background detaches cut to half a second (a mount
    made here is gone at once or never)."""
    text = CONFTEST.read_text()
    assert "_LEAK_WAIT_S = 15.0" in text
    return text.replace("_LEAK_WAIT_S = 15.0", "_LEAK_WAIT_S = 0.5")


def _mounts_under(base: Path) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return [line.split()[4] for line in fh if line.split()[4].startswith(f"{base}/")]


def test_a_file_that_leaves_a_mount_fails_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_conftest())
    pytester.makepyfile(test_leaves=LEAVES)
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "--basetemp",
                                    str(pytester.path / "t"))
        result.assert_outcomes(passed=1, errors=1)  # the test passed; its file's teardown not
        out = result.stdout.str()
        assert "test_leaves.py left 1 mount(s) of its temporary paths" in out, out[-3000:]
        assert f"{pytester.path}/t/test_mounts_a_tmpfs_and_leaves0/m <- /" in out, out[-3000:]
    finally:
        for point in _mounts_under(pytester.path):
            subprocess.run(["umount", point], check=True)


def test_a_file_that_removes_its_mount_passes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_conftest())
    pytester.makepyfile(test_cleans=CLEANS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--basetemp", str(pytester.path / "t"))
    result.assert_outcomes(passed=1)
    assert _mounts_under(pytester.path) == []
