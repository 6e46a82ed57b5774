"""A call's stdin reaches the program in a docker container (run-once and the launcher pool).

The guard admits ``stdin_b64`` up to ``bytes_in``; the docker executor used to refuse every
stdin (explain allow, run ``CAPABILITY_BLOCKED``; conformance `evidence.complete` failed on
its stdin probe once F16 let read-only calls through).
"""

from __future__ import annotations

import base64
import hashlib
import time
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import Limits, ProcExecOp
from tests.integration.test_docker_executor import make_profile

pytestmark = pytest.mark.integration

DIGEST = ("import hashlib, sys; d = sys.stdin.buffer.read(); "
          "print(len(d), hashlib.sha256(d).hexdigest())")
MODES = {"run-once": DockerOptions(), "launcher": DockerOptions(mode="pool", pool_size=1)}


def _ctx(tmp: Path, **limits: int) -> ExecContext:
    (tmp / "fs").mkdir(exist_ok=True)  # root_fs beside the state dir, not above it
    prof = make_profile(tmp / "fs")
    return ExecContext(profile=prof, deadline=time.monotonic() + 90,
                       limits=prof.limits.model_copy(update=limits) if limits else Limits())


@pytest.mark.parametrize("mode", list(MODES))
def test_stdin_reaches_the_program_whole(tmp_path: Path, mode: str) -> None:
    ex = DockerExecutor(MODES[mode], state_dir=tmp_path / "state")
    data = bytes(range(256)) * (3 << 12)  # 3 MiB, every byte value
    try:
        out = ex.execute(_ctx(tmp_path), ProcExecOp(
            tool="python3", args=("-c", DIGEST), stdin_b64=base64.b64encode(data).decode())).out
        assert out["stdout"].split() == [str(len(data)), hashlib.sha256(data).hexdigest()]
        # a program that reads nothing does not hang on the rest
        quiet = ex.execute(_ctx(tmp_path), ProcExecOp(
            tool="/bin/true", stdin_b64=base64.b64encode(data).decode())).out
        assert quiet["exit_code"] == 0
        # without stdin the program reads EOF at once
        empty = ex.execute(_ctx(tmp_path), ProcExecOp(tool="python3", args=("-c", DIGEST))).out
        assert empty["stdout"].split()[0] == "0"
        with pytest.raises(PolicyEngineError) as exc:
            ex.execute(_ctx(tmp_path, max_bytes_in=1024), ProcExecOp(
                tool="python3", args=("-c", DIGEST), stdin_b64=base64.b64encode(data).decode()))
        assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    finally:
        ex.close()


def test_docker_exec_pool_refuses_stdin_by_name(tmp_path: Path) -> None:
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1, pool_launcher=False),
                        state_dir=tmp_path / "state")
    try:
        with pytest.raises(PolicyEngineError) as exc:
            ex.execute(_ctx(tmp_path), ProcExecOp(tool="/bin/cat", stdin_b64="aGk="))
        assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
        assert "pool_launcher: false" in exc.value.reason
    finally:
        ex.close()
