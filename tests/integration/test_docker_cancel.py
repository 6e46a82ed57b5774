"""A cancelled docker call stops within a second, in every mode (conformance `cancel.honoured`).

Before, run-once blocked in the engine's wait and the pool in the launcher's socket or the exec
stream until the wall deadline, whatever ``ExecContext.cancel`` said.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_docker_executor import make_profile

pytestmark = pytest.mark.integration

MODES = {"run-once": DockerOptions(), "launcher": DockerOptions(mode="pool", pool_size=1),
         "docker-exec": DockerOptions(mode="pool", pool_size=1, pool_launcher=False)}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_cancelled_call_ends_promptly(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "fs"
    root.mkdir()
    ex = DockerExecutor(MODES[mode], state_dir=tmp_path / "state")
    try:
        ex.execute(ExecContext(profile=make_profile(root), deadline=time.monotonic() + 90),
                   ProcExecOp(tool="true"))  # warm: the pool's container is up
        ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
        timer = threading.Timer(1.0, ctx.cancel.cancel, args=("test cancelled",))
        timer.start()
        start = time.monotonic()
        with pytest.raises(PolicyEngineError) as exc:
            ex.execute(ctx, ProcExecOp(tool="/bin/sleep", args=("30",)))
        took = time.monotonic() - start
        timer.cancel()
        assert exc.value.code is ErrorCode.EXECUTION_FAILED
        assert "cancelled" in exc.value.reason
        assert took < 4, f"{took:.1f}s after a cancellation at 1 s"
        # the container is usable (pool) or gone (run-once): the next call runs
        again = ex.execute(ExecContext(profile=make_profile(root),
                                       deadline=time.monotonic() + 60),
                           ProcExecOp(tool="/bin/echo", args=("ok",)))
        assert again.out["stdout"] == "ok\n"
    finally:
        ex.close()
