"""Outsider round 4 F04: a tool the memory cgroup's OOM killer ends is a limit hit, not a result.

It was `result: ok`, `exit_code: 137`, no code, `policy-engine run` exit 0 (proc-unshare, local).
Now, as for a file over `max_file_bytes` (`SIGXFSZ`), the call fails with
`QUOTA.BUDGET_EXCEEDED` naming the memory limit, exit 1, evidence status `error`. A tool that
SIGKILLs itself (no OOM kill counted in its cgroup) stays a result (docs/plugins.md, "Exit
codes"), and so does a tool's own non-zero exit: `run` exits 0 for both (docs/cli.md). Run for
real through `policy-engine run` with a 64 MiB memory limit on each first-party proc backend.

Outsider round 5 F07: "status 137 and an OOM kill counted" also caught a tool that exited 137
itself after its child's OOM kill (`sh -c 'cmd; exit $?'`); a SIGKILL and an exit code 137 are
now told apart (the tool's parent launcher reports which behind bwrap and proc-unshare).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_backend import run_on_backend

pytestmark = pytest.mark.integration

POLICY = """\
policy "oom" version "1"
defaults { timeout 60s  limits { memory 64MiB } }
permit proc.exec tool "python3" args ["-c", /.*/]
"""
MANIFEST = """\
tool "t" version "1" {
  permit proc.exec tool "python3" args ["-c", /.*/]
}
"""
GRANT = {"tenant": "acme", "subject_id": "a", "tool_name": "t", "call_id": "c1",
         "expires_at": 4102444800000, "capabilities": [{"kind": "proc.exec", "tool": "python3"}]}
# touches 512 MiB, 8 MiB at a time: the cgroup (64 MiB) kills it long before the end
GREEDY = "b = [b'x' * (8 << 20) for _ in range(64)]; print('allocated')"
SELF_KILLED = "import os; os.kill(os.getpid(), 9)"
# a child the OOM killer ends, then the tool exits 137 on its own, as `sh -c 'cmd; exit $?'`,
# make and xargs pass a killed child's status on (outsider round 5, F07)
CHILD_KILLED_TOOL_EXITS_137 = (
    f"import subprocess, sys; r = subprocess.run([sys.executable, '-c', {GREEDY!r}]); "
    "print('child rc', r.returncode, flush=True); sys.exit(137)")
BACKENDS = ["proc-bwrap", "proc-landlock", "proc-unshare", "local"]


def _run(tmp: Path, backend: str, code: str) -> tuple[int, dict[str, Any]]:
    return run_on_backend(tmp, backend, policy=POLICY, manifest=MANIFEST, grant=GRANT,
                          argv=("python3", "-c", code))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_oom_kill_is_budget_exceeded_naming_the_memory_limit(tmp_path: Path,
                                                                backend: str) -> None:
    rc, out = _run(tmp_path, backend, GREEDY)
    result = out["result"]
    assert result["ok"] is False, result
    assert result["code"] == "QUOTA.BUDGET_EXCEEDED", result
    assert "memory" in result["message"], result
    assert str(64 << 20) in result["message"], result
    assert rc == 1
    end = out["evidence"]
    assert end["status"] == "error"
    assert end["error_code"] == "QUOTA.BUDGET_EXCEEDED"
    assert end["sandbox_success"] is False
    assert "allocated" not in json.dumps(out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_self_inflicted_sigkill_and_a_non_zero_exit_stay_results(tmp_path: Path,
                                                                   backend: str) -> None:
    rc, out = _run(tmp_path, backend, SELF_KILLED)
    assert out["result"]["ok"] is True, out["result"]
    assert out["result"]["out"]["exit_code"] == 128 + 9
    assert out["result"]["out"]["signal"] == 9  # 137 alone could be an exit code (round 5 F07)
    assert rc == 0  # the call ran; the tool's status is in the result
    rc, out = _run(tmp_path, backend, "raise SystemExit(3)")
    assert out["result"]["ok"] is True, out["result"]
    assert out["result"]["out"]["exit_code"] == 3
    assert "signal" not in out["result"]["out"]
    assert rc == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tool_exiting_137_after_its_child_was_oom_killed_stays_a_result(
        tmp_path: Path, backend: str) -> None:
    """Outsider round 5 F07: the OOM kill of a child plus a tool status of 137 was taken for
    the tool's own OOM kill (`QUOTA.BUDGET_EXCEEDED`, stdout dropped). An exit code 137 is not
    a death by SIGKILL: the result stands, with the child's OOM kill counted in it."""
    rc, out = _run(tmp_path, backend, CHILD_KILLED_TOOL_EXITS_137)
    result = out["result"]
    assert result["ok"] is True, result
    assert result["out"]["exit_code"] == 137
    assert result["out"]["oom_kills"] >= 1  # the child's, as the cgroup counted it
    assert result["out"]["stdout"] == "child rc -9\n"  # the tool's output is kept
    assert rc == 0
    assert out["evidence"]["status"] != "error", out["evidence"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_tool_holds_no_descriptor_to_forge_its_end_with(tmp_path: Path, backend: str) -> None:
    """The launcher that reports how the tool ended keeps the status pipe; the tool must not
    have it (else it could write `{"tool_end": {"exit": 0}}` after its own OOM kill)."""
    probe = ("import os\ndef held(fd):\n try: return os.fstat(fd) is not None\n"
             " except OSError: return False\nprint([fd for fd in range(1024) if held(fd)])")
    rc, out = _run(tmp_path, backend, f"exec({probe!r})")
    assert rc == 0, out["result"]
    assert out["result"]["out"]["stdout"] == "[0, 1, 2]\n"
