"""Evidence of a contained read in one append (issue 27; docs/operations.md "Evidence: one
append for contained reads"): an fs read or listing writes its begin and end records together
after it ran; a write (and anything an executor may do outside the engine) still has its begin
record on disk before it runs.

The crash tests kill a real engine process (SIGKILL, in a spawned interpreter) at the moment
the executor announces its first side effect (``ExecContext.started``, wrapped in the child:
a fault injected at a chosen point, the executor itself runs unchanged). What the docs promise:
a killed read leaves neither record and answered nobody; a killed write leaves its begin
record; the log stays a whole, verifiable chain either way.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.evidence.verify import read_jsonl, verify_records
from policy_engine.executor import ExecContext
from policy_engine.model import ExecOp, FsListOp, FsReadOp, FsWriteOp, Grant, Manifest, Settings
from policy_engine.orchestrator import Orchestrator

pytestmark = pytest.mark.integration
SPAWN = multiprocessing.get_context("spawn")


def _setup(root: Path) -> tuple[Path, Path]:
    ws = root / "ws"
    (ws / "work").mkdir(parents=True)
    (ws / "README.md").write_text("hello\n")
    policy = root / "p.sbpolicy"
    policy.write_text(f'policy "t/one-append" version "1.0.0"\n'
                      f'permit "read" fs.read, fs.list paths ["{ws}/**"]\n'
                      f'permit "write" fs.write paths ["{ws}/work/**"]\n'
                      f'forbid "secret" fs.read paths ["{ws}/secret/**"]\n')
    return ws, policy


def _grant(ws: Path) -> Grant:
    return Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "rw", "call_id": "c1",
        "expires_at": 4102444800000,
        "capabilities": [{"kind": "fs.read", "paths": [f"{ws}/**"]},
                         {"kind": "fs.list", "paths": [f"{ws}/**"]},
                         {"kind": "fs.write", "paths": [f"{ws}/work/**"]}],
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4102444800000}})


def _manifest(ws: Path) -> Manifest:
    return Manifest.model_validate({
        "name": "rw", "version": "1", "side_effects": ["Read", "Write"], "safety_class": "Low",
        "permissions": [{"kind": k, "paths": [f"{ws}/**"]}
                        for k in ("fs.read", "fs.list", "fs.write")]})


def _orchestrator(root: Path, policy: Path) -> Orchestrator:
    return Orchestrator(compile_files([policy]), config=EngineConfig(
        state_dir=root / "state", revocation="memory"))


def _ops(ws: Path, n: int = 0) -> dict[str, ExecOp]:
    return {"read": FsReadOp(path=f"{ws}/README.md"), "list": FsListOp(path=f"{ws}"),
            "write": FsWriteOp(path=f"{ws}/work/out-{n}.txt",
                               bytes_b64=base64.b64encode(b"data").decode())}


def _records(root: Path) -> list[dict[str, Any]]:
    log = root / "state" / "evidence" / "evidence.jsonl"
    return [r for r in (json.loads(line) for line in log.read_text().splitlines())
            if r.get("type") != "checkpoint"]


def _chain_ok(root: Path) -> bool:
    report = verify_records(read_jsonl(root / "state" / "evidence" / "evidence.jsonl"))
    return not report.problems


def _run_then_die(root: str, which: str, envelope_file: str) -> None:
    """In a spawned engine: one call of ``which`` that completes, then one killed at the
    executor's first side effect."""
    base = Path(root)
    ws, policy = _setup_existing(base)
    orch = _orchestrator(base, policy)
    done = orch.run(_grant(ws), _manifest(ws), _ops(ws, 1)[which],
                    settings=Settings(root_fs=str(ws)))
    assert done.result.ok, done.result
    Path(envelope_file).write_text(done.envelope_id)
    started = ExecContext.started

    def die(ctx: ExecContext) -> None:
        started(ctx)
        os.kill(os.getpid(), signal.SIGKILL)

    ExecContext.started = die  # type: ignore[method-assign,assignment]  # the injected fault
    again = orch.run(_grant(ws), _manifest(ws), _ops(ws, 2)[which],
                     settings=Settings(root_fs=str(ws)))
    raise AssertionError(f"the call returned ({again.result}): it should have been killed")


def _setup_existing(root: Path) -> tuple[Path, Path]:
    return root / "ws", root / "p.sbpolicy"


def _killed(tmp_path: Path, which: str) -> tuple[str, list[dict[str, Any]]]:
    _setup(tmp_path)
    marker = tmp_path / "completed"
    child = SPAWN.Process(target=_run_then_die, args=(str(tmp_path), which, str(marker)))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL, child.exitcode
    return marker.read_text(), _records(tmp_path)


@pytest.mark.parametrize("which", ["read", "list"])
def test_a_read_killed_mid_call_leaves_neither_record(tmp_path: Path, which: str) -> None:
    completed, records = _killed(tmp_path, which)
    # only the completed call is in the log, both its records: the killed one answered nobody
    assert [(r["type"], r["envelope_id"]) for r in records] == [
        ("begin", completed), ("end", completed)]
    assert _chain_ok(tmp_path)


def test_a_write_killed_mid_call_leaves_its_begin_record(tmp_path: Path) -> None:
    completed, records = _killed(tmp_path, "write")
    kinds = [(r["type"], r["envelope_id"] == completed) for r in records]
    assert kinds == [("begin", True), ("end", True), ("begin", False)]
    assert records[-1]["capability"].startswith("fs.write")
    assert _chain_ok(tmp_path)


def test_contained_calls_write_begin_and_end_adjacent_others_begin_first(
        tmp_path: Path) -> None:
    """Through the live sink: a read's two records are appended together (adjacent, in
    order, chained); a write's begin is on disk before its executor starts."""
    ws, policy = _setup(tmp_path)
    log = tmp_path / "state" / "evidence" / "evidence.jsonl"
    seen_at_start: list[int] = []
    started = ExecContext.started

    def count(ctx: ExecContext) -> None:  # how many records the log holds as the op starts
        seen_at_start.append(len(log.read_text().splitlines()))
        started(ctx)

    with _orchestrator(tmp_path, policy) as orch, pytest.MonkeyPatch.context() as mp:
        mp.setattr(ExecContext, "started", count)
        ops = _ops(ws)
        outs = [orch.run(_grant(ws), _manifest(ws), ops[w], settings=Settings(root_fs=str(ws)))
                for w in ("read", "write", "list")]
        denied = orch.run(_grant(ws), _manifest(ws), FsReadOp(path=f"{ws}/secret/k"),
                          settings=Settings(root_fs=str(ws)))
    assert all(o.result.ok for o in outs), [o.result for o in outs]
    assert not denied.result.ok
    # read: nothing of it on disk as it starts; write: its begin is (2 read records + 1)
    assert seen_at_start == [0, 3, 4]
    records = _records(tmp_path)
    pairs = [(r["type"], r["envelope_id"]) for r in records]
    assert pairs == [(t, o.envelope_id) for o in (*outs, denied) for t in ("begin", "end")]
    seqs = [r["chain"]["seq"] for r in records]
    assert seqs == sorted(seqs)
    assert _chain_ok(tmp_path)
