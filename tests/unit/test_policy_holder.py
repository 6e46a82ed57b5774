"""Hot reload swaps one holder: the orchestrators pinned to a backend decide with the running
engine's profile builder and guard, and one swap reaches them all (issue 25 item 1)."""

from __future__ import annotations

from pathlib import Path

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.orchestrator import Orchestrator
from policy_engine.runcode.manager import OrchestratorPool


def _policy(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.sbpolicy"
    path.write_text(f'policy "t/{name}" version "1.0.0"\n{body}\n')
    return path


def test_one_swap_reaches_every_pinned_orchestrator(tmp_path: Path) -> None:
    old = compile_files([_policy(tmp_path, "old", 'permit "py" proc.exec tool "python3"')])
    new = compile_files([_policy(tmp_path, "new", 'forbid "no-py" proc.exec tool "python3"')])
    config = EngineConfig(state_dir=tmp_path / "state", revocation="memory")
    with Orchestrator(old, config=config) as orch:
        pool = OrchestratorPool(old, config, holder=orch.holder)
        try:
            pinned = [pool.get("proc-bwrap"), pool.get("docker")]
            # one builder and guard for the running engine, whatever the backend
            assert all(p.guard is orch.guard and p.builder is orch.builder for p in pinned)
            orch.swap_policy(new)  # what the reloader does, once
            assert all(p.policyset is new and p.guard is orch.guard for p in pinned)
            assert pool.get("proc-landlock").policyset is new  # made after the swap
            assert orch.guard.policyset is new
        finally:
            pool.close()


def test_a_pool_of_its_own_still_swaps_as_one(tmp_path: Path) -> None:
    old = compile_files([_policy(tmp_path, "old", 'permit "py" proc.exec tool "python3"')])
    new = compile_files([_policy(tmp_path, "new", 'forbid "no-py" proc.exec tool "python3"')])
    pool = OrchestratorPool(old, EngineConfig(state_dir=tmp_path / "s", revocation="memory"))
    try:
        a, b = pool.get("proc-bwrap"), pool.get("docker")
        assert a.holder is b.holder
        pool.swap(new)
        assert a.policyset is new
        assert b.policyset is new
    finally:
        pool.close()
