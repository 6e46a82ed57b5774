"""One exit-code rule for every first-party process executor (docs/plugins.md, "Exit codes").

A tool that ran is a result, not a failure: ``ok`` with ``out.exit_code`` as a shell reports it
(the tool's status; 128 + N when signal N killed it; 127 when the tool cannot be found). Run for
real through `policy-engine run` on proc-bwrap, proc-landlock, proc-unshare and docker (`local`:
tests/integration/test_local_executor.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KILLED = "import os; os.kill(os.getpid(), 9)"

POLICY = """\
policy "exit-codes" version "1"
defaults { timeout 60s }
permit proc.exec tool "nosuchtool"
permit proc.exec tool "python3" args ["-c", /.*/]
"""
MANIFEST = """\
tool "t" version "1" {
  permit proc.exec tool "nosuchtool"
  permit proc.exec tool "python3" args ["-c", /.*/]
}
"""
GRANT = {"tenant": "acme", "subject_id": "a", "tool_name": "t", "call_id": "c1",
         "expires_at": 4102444800000,
         "capabilities": [{"kind": "proc.exec", "tool": "nosuchtool"},
                          {"kind": "proc.exec", "tool": "python3"}]}


def run(tmp: Path, backend: str, *argv: str) -> dict[str, Any]:
    (tmp / "p.sbpolicy").write_text(POLICY)
    (tmp / "m.sbpolicy").write_text(MANIFEST)
    (tmp / "g.json").write_text(json.dumps(GRANT))
    # compat: landlock has no bind mounts and the docker image no read-only root to offer;
    # mandatory denies (which every one of them has) never degrade
    (tmp / "c.yaml").write_text(f"state_dir: {tmp / 'state'}\nmode: compat\n"
                                f"backends:\n  proc.exec: {backend}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--policy", str(tmp / "p.sbpolicy"),
         "--manifest", str(tmp / "m.sbpolicy"), "--grant", str(tmp / "g.json"),
         "--config", str(tmp / "c.yaml"), "--format", "json", "--", *argv],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data.get("result", data)


BACKENDS = ["proc-bwrap", "proc-landlock", "proc-unshare", "docker"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_non_zero_exit_is_a_result(tmp_path: Path, backend: str) -> None:
    result = run(tmp_path, backend, "python3", "-c", "raise SystemExit(3)")
    assert result["ok"] is True
    assert result["out"]["exit_code"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_tool_is_127_with_the_reason_on_stderr(tmp_path: Path, backend: str) -> None:
    result = run(tmp_path, backend, "nosuchtool")
    assert result["ok"] is True, result
    assert result["out"]["exit_code"] == 127
    assert "cannot execute `nosuchtool`" in result["out"]["stderr"]


# docker's run-once mode makes the tool pid 1, which a signal it sends itself cannot kill
@pytest.mark.parametrize("backend", ["proc-bwrap", "proc-landlock", "proc-unshare"])
def test_a_signal_is_128_plus_its_number(tmp_path: Path, backend: str) -> None:
    result = run(tmp_path, backend, "python3", "-c", KILLED)
    assert result["ok"] is True
    assert result["out"]["exit_code"] == 128 + 9
