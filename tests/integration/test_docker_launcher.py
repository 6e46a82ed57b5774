"""The warm pool's in-container launcher: nothing sandboxed can reach or subvert PID 1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_docker.control import CONTROL_DIR
from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import (
    ArgAlternative,
    CapabilityKind,
    ProcCapability,
    ProcExecOp,
    ProfileCapability,
)
from tests.integration.test_docker_pool import make_profile

pytestmark = pytest.mark.integration

PROBE = f"""
import json, os, signal, socket
out = {{"ctl": sorted(os.listdir("{CONTROL_DIR}")), "env": sorted(os.environ)}}
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect("{CONTROL_DIR}/ctl.sock")
    out["connect"] = "connected"
except OSError as e:
    out["connect"] = type(e).__name__
for what, fn in (("mem", lambda: open("/proc/1/mem", "rb").read(1)),
                 ("kill", lambda: os.kill(1, signal.SIGKILL))):
    try:
        fn()
        out[what] = "done"
    except OSError as e:
        out[what] = type(e).__name__
out["pid1"] = open("/proc/1/cmdline", "rb").read().split(b"\\0")[3].decode()
print(json.dumps(out))
"""


@pytest.fixture
def pooled(tmp_path: Path) -> Iterator[DockerExecutor]:
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1, workspace_root=str(tmp_path)))
    yield ex
    ex.close()


def run(ex: DockerExecutor, root: Path, tool: str, *args: str, **kw: Any) -> dict[str, Any]:
    # the executor's second line admits only variables a proc.exec capability's env lists
    env_cap = ProfileCapability(kind=CapabilityKind.PROC_EXEC, all_of=(ProcCapability(
        tool=tool, env=(ArgAlternative(literal="ONLY"),)),))
    profile = make_profile(root).model_copy(update={"capabilities": (env_cap,)})
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 90)
    return ex.execute(ctx, ProcExecOp(tool=tool, args=args, **kw)).out


def test_the_control_socket_is_gone_and_pid1_cannot_be_touched(
    pooled: DockerExecutor, tmp_path: Path
) -> None:
    out = run(pooled, tmp_path, "python3", "-c", PROBE, env={"ONLY": "this"})
    seen = json.loads(out["stdout"])
    assert seen["ctl"] == ["launcher.py"]  # the socket was removed once PID 1 connected
    # network off: the command gets no AF_UNIX socket at all (second pass N2); the socket
    # file is gone as well (above)
    assert seen["connect"] == "PermissionError"
    assert seen["mem"] == "PermissionError"  # PID 1 is not dumpable
    assert seen["pid1"] == f"{CONTROL_DIR}/launcher.py"
    # exactly the executor's environment, nothing inherited from the launcher
    assert seen["env"] == ["GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_PARAMETERS",
                           "HOME", "LANG", "ONLY", "PATH", "PE_ARTIFACTS_DIR"]
    # the SIGKILL to PID 1 from inside the namespace was ignored: the launcher still serves
    assert run(pooled, tmp_path, "python3", "-c", "print(6 * 7)")["stdout"] == "42\n"


def test_a_background_process_holding_stdout_does_not_hold_the_call(
    pooled: DockerExecutor, tmp_path: Path
) -> None:
    start = time.monotonic()
    out = run(pooled, tmp_path, "/bin/sh", "-c", "sleep 30 & echo started")
    assert out["stdout"] == "started\n"
    assert out["exit_code"] == 0
    assert time.monotonic() - start < 15


def test_exit_codes_and_a_missing_program(pooled: DockerExecutor, tmp_path: Path) -> None:
    assert run(pooled, tmp_path, "python3", "-c", "raise SystemExit(3)")["exit_code"] == 3
    killed = run(pooled, tmp_path, "/bin/sh", "-c", "kill -9 $$")
    assert killed["exit_code"] == 137
    missing = run(pooled, tmp_path, "/no/such/tool")
    assert missing["exit_code"] == 127
    assert "cannot run" in missing["stderr"]
