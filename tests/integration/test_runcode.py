"""SandboxManager.run_code on the real backends: bubblewrap for what the security mode allows,
a Docker container otherwise; the policy decides every run whatever the risk hint says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.gateway.sessions import SandboxManager
from policy_engine.runcode.manager import OrchestratorPool
from policy_engine.runcode.risk import SecurityMode

pytestmark = pytest.mark.integration

POLICY = """policy "rc/test" version "1.0.0"
permit "py" proc.exec  tool "python3"
{shell}
permit "session-files" fs.read, fs.write  paths ["{ws}/**", "/workspace/work/**"]
require consent when `profile.safety == "High"`
"""


def _pool(tmp: Path, *, shell: bool) -> tuple[OrchestratorPool, Path]:
    ws = tmp / "ws"
    policy = tmp / "rc.sbpolicy"
    policy.write_text(POLICY.format(ws=ws, shell='permit "sh" proc.exec  tool "bash"'
                                    if shell else ""))
    config = EngineConfig(state_dir=tmp / "state")
    return OrchestratorPool(compile_files([policy]), config), ws


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OrchestratorPool, Path]]:
    made = _pool(tmp_path_factory.mktemp("rc"), shell=True)
    yield made
    made[0].close()


def _manager(pool: tuple[OrchestratorPool, Path], mode: SecurityMode,
             session: str = "s1") -> SandboxManager:
    return SandboxManager(session, policyset=pool[0].policyset, config=pool[0].config,
                          security_mode=mode, tenant="acme", workspace_root=pool[1],
                          pool=pool[0])


def test_safe_code_runs_under_bubblewrap_with_evidence(pool: tuple[OrchestratorPool, Path]
                                                       ) -> None:
    result = _manager(pool, SecurityMode.STRICT).run_code("print(6 * 7)", "python")
    assert result.success, result
    assert result.stdout == "42\n"
    assert result.sandbox_type == "proc-bwrap"
    assert result.risk.level.name == "SAFE"
    evidence = "\n".join(p.read_text() for p in (pool[0].config.state_dir).rglob("*.jsonl"))
    ends = [json.loads(line) for line in evidence.splitlines()
            if result.exec_id in line and '"status"' in line]
    assert ends
    assert ends[0]["sandbox_backend"] == "proc-bwrap"
    begins = [json.loads(line) for line in evidence.splitlines()
              if result.exec_id in line and '"type":"begin"' in line.replace(" ", "")]
    assert begins[0]["annotations"]["risk"] == result.risk.to_json()  # the hint is evidence


def test_strict_sends_anything_not_safe_to_a_container(pool: tuple[OrchestratorPool, Path]
                                                       ) -> None:
    code = "import os\nprint(os.getcwd())"
    strict = _manager(pool, SecurityMode.STRICT).run_code(code, "python", timeout=60)
    assert strict.success, strict
    assert strict.sandbox_type == "docker"
    assert strict.stdout == "/workspace/work\n"
    assert strict.risk.patterns == ("import os",)


def test_permissive_lets_low_risk_code_use_bubblewrap(pool: tuple[OrchestratorPool, Path]
                                                      ) -> None:
    code = "seq 3 | wc -l"
    permissive = _manager(pool, SecurityMode.PERMISSIVE).run_code(code, "shell")
    assert permissive.sandbox_type == "proc-bwrap"
    assert permissive.stdout.strip() == "3"
    strict = _manager(pool, SecurityMode.PERMISSIVE).run_code("import os", "python")
    assert strict.sandbox_type == "docker"


def test_the_hint_is_not_the_boundary(pool: tuple[OrchestratorPool, Path],
                                      tmp_path: Path) -> None:
    # LOW risk (an `open` call): permissive runs it under bubblewrap, where the policy's fs
    # rules still hold — nothing outside the session's work directory is writable
    target = tmp_path / "escape.txt"
    code = f"open({str(target)!r}, 'w').write('x')"
    result = _manager(pool, SecurityMode.PERMISSIVE).run_code(code, "python")
    assert result.risk.level.name == "LOW"
    assert result.sandbox_type == "proc-bwrap"
    assert not result.success
    assert result.exit_code == 1
    assert "Read-only file system" in result.stderr or "No such file" in result.stderr
    assert not target.exists()


def test_a_language_the_policy_does_not_permit_is_denied(tmp_path: Path) -> None:
    made = _pool(tmp_path, shell=False)
    try:
        result = _manager(made, SecurityMode.STRICT).run_code("echo hi", "shell")
    finally:
        made[0].close()
    assert not result.success
    assert result.error_code == "SANDBOX.PERMISSION_DENY"
    assert result.exit_code is None
    assert result.risk.level.name == "SAFE"  # a SAFE hint allows nothing by itself


def test_session_ids_name_directories_safely(pool: tuple[OrchestratorPool, Path]) -> None:
    for bad in ("..", "../x", "a/b", "", "-x"):
        with pytest.raises(ValueError, match="session id"):
            _manager(pool, SecurityMode.STRICT, session=bad)
