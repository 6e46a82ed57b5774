"""The fs executor opens its root only as the root's own real path (outsider round 11, F3).

The guard refuses a root given through a symlink; the run must refuse it too, on the directory
it actually opened, so a root re-pointed between the decision and the open reads nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugins.executor_fs.resolve import open_root
from policy_engine import ErrorCode, PolicyEngineError


def test_the_real_root_opens_spelt_with_a_trailing_slash_or_dot(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    for spelling in (str(real), f"{real}/", f"{real}/./"):
        fd = open_root(spelling)
        try:
            assert os.readlink(f"/proc/self/fd/{fd}") == str(real)
        finally:
            os.close(fd)


@pytest.mark.parametrize("how", ["the root", "a parent"])
def test_a_root_with_a_symlink_on_its_path_is_refused(tmp_path: Path, how: str) -> None:
    real = tmp_path / "real" / "ws"
    real.mkdir(parents=True)
    if how == "the root":
        os.symlink(real, tmp_path / "link")
        root = tmp_path / "link"
    else:
        os.symlink(tmp_path / "real", tmp_path / "parent")
        root = tmp_path / "parent" / "ws"
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(PolicyEngineError) as err:
        open_root(str(root))
    assert err.value.code == ErrorCode.CAPABILITY_BLOCKED
    assert "has a symlink on its path" in err.value.reason
    assert len(os.listdir("/proc/self/fd")) == before  # the descriptor was closed
