"""A masked path that vanishes between the mask plan and bubblewrap's mounts does not fail the
call: the sandbox is planned again (at most twice more), as the docker executor does
(``test_docker_vanishing_mask.py``).

A `.env` in the bound tree is masked by ``--ro-bind /dev/null`` over it; removed after the plan
and before bwrap mounts, bwrap cannot make the mount point in the read-only bind ("Can't mkdir
parents ... Read-only file system", "Can't create file") and the call failed with
``TOOL.EXECUTION_FAILED`` while another process created and removed a `.env` there."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine import PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.planted import coming_and_going
from tests.integration.test_proc_sandbox import PY, make_profile

pytestmark = pytest.mark.integration


@pytest.fixture
def churn(tmp_path: Path) -> Iterator[Path]:
    """The bound tree, where a `.env` in a fresh directory lives 0.3 s, then is gone 0.3 s."""
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    with coming_and_going(root, 0.3):
        yield root


def test_bwrap_calls_succeed_while_a_masked_path_comes_and_goes(churn: Path) -> None:
    ex = ProcExecutor("bwrap", ProcOptions())
    failed: list[str] = []
    try:
        for _ in range(40):
            ctx = ExecContext(profile=make_profile(churn), deadline=time.monotonic() + 60)
            try:
                out = ex.execute(ctx, ProcExecOp(tool=PY, args=("-c", "print('ok')"))).out
                assert out["stdout"] == "ok\n", out
            except PolicyEngineError as exc:
                failed.append(exc.reason)
    finally:
        ex.close()
    assert not failed, failed
