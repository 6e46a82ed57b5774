"""One exit-code rule for every first-party process executor (docs/plugins.md, "Exit codes").

A tool that ran is a result, not a failure: ``ok`` with ``out.exit_code`` as a shell reports it
(the tool's status; 128 + N when signal N killed it; 127 when the tool cannot be found). Run for
real through `policy-engine run` on proc-bwrap, proc-landlock, proc-unshare and docker (`local`:
tests/integration/test_local_executor.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_backend import run_on_backend

pytestmark = pytest.mark.integration

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
    _, data = run_on_backend(tmp, backend, policy=POLICY, manifest=MANIFEST, grant=GRANT,
                             argv=argv)
    result: dict[str, Any] = data.get("result", data)
    return result


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
