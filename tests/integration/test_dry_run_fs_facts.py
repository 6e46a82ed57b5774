"""Dry run equals run for what lies on the disk (issue 10 item 4; outsider findings F6, F12).

Each case is decided by ``explain`` and then run through the orchestrator on the real fs
executor and bubblewrap, in a real workspace: a directory or FIFO read as a file, a whole read
over a rule's ``bytes_in``, a write over an existing file without ``overwrite``, in-root
symlinks (explain allowed, the run refused every one), a symlink retargeted between the decision
and the run, and a ``cwd`` whose symlink leads out of the root.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.explain import explain
from policy_engine.explain.request import ExplainRequest
from policy_engine.graph import PolicySet
from policy_engine.model import (
    Decision,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    ProcExecOp,
    Settings,
)
from policy_engine.orchestrator import Orchestrator, RunOutcome

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BLOCKED = "SANDBOX.CAPABILITY_BLOCKED"

POLICY = """policy "t/fs-facts" version "1.0.0"
defaults {{ timeout 20s  network off }}
permit "small" fs.read paths ["{root}/small/**"] limits {{ bytes_in 16B }}
permit "read" fs.read, fs.list paths ["{root}/**"]
permit "write" fs.write paths ["{root}/**"]
forbid "no-private" fs.read, fs.list, fs.write paths ["{root}/private/**"]
permit "py" proc.exec tool "python3"
"""
CAPS: list[dict[str, Any]] = [
    {"kind": "fs.read", "paths": ["/**"]}, {"kind": "fs.list", "paths": ["/**"]},
    {"kind": "fs.write", "paths": ["/**"]}, {"kind": "proc.exec", "tool": "python3"}]


@dataclass
class World:
    root: Path
    policy: Path
    policyset: PolicySet
    grant: Grant
    manifest: Manifest
    settings: Settings
    orch: Orchestrator

    def explain(self, op: Any) -> Decision:
        # the run's dry run (`explain --config`): a cwd is a fact of the executor's view, which
        # the backend step asks (issue 26)
        return explain(self.policyset, self.manifest, self.grant,
                       ExplainRequest(op=op, settings=self.settings),
                       executors=self.orch.components.executors,
                       config=self.orch.config).decision

    def run(self, op: Any) -> RunOutcome:
        return self.orch.run(self.grant, self.manifest, op, settings=self.settings)

    def both(self, op: Any) -> tuple[Decision, RunOutcome]:
        return self.explain(op), self.run(op)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield from make_world(tmp_path, POLICY)


def make_world(tmp_path: Path, source: str) -> Iterator[World]:
    root = tmp_path / "ws"
    for d in ("sub2", "small", "private", "work"):
        (root / d).mkdir(parents=True)
    (root / "sub2" / "ok.txt").write_text("in sub2")
    (root / "private" / "key.txt").write_text("PRIVATE")
    (root / "small" / "big.txt").write_bytes(b"S" * 1000)
    (root / "w.txt").write_text("x")
    os.mkfifo(root / "pipe")
    os.symlink("sub2", root / "l_sub")
    os.symlink("w.txt", root / "l_w")
    os.symlink("private", root / "l_private")
    os.symlink("/etc", root / "l_etc")
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(source.format(root=root))
    policyset = compile_files([policy])
    grant = Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
        "capabilities": CAPS, "expires_at": 4_102_444_800_000, "budget": {"calls": 100},
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4_102_444_800_000}})
    manifest = Manifest.model_validate({
        "name": "tool", "version": "1.0.0", "permissions": CAPS,
        "side_effects": ["Process", "Read", "Write"], "safety_class": "Low"})
    config = EngineConfig(state_dir=tmp_path / "state", revocation="memory")
    with Orchestrator(policyset, config=config) as orch:
        yield World(root, policy, policyset, grant, manifest, Settings(root_fs=str(root)), orch)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ---- what the fs executor refuses, explain now refuses with the same code ---------------------

@pytest.mark.parametrize("case", ["directory", "fifo", "over-bytes_in", "no-overwrite",
                                  "over-a-directory"])
def test_explain_refuses_what_the_fs_executor_refuses(world: World, case: str) -> None:
    r = world.root
    op, words = {
        "directory": (FsReadOp(path=f"{r}/sub2"), "is not a regular file"),
        "fifo": (FsReadOp(path=f"{r}/pipe"), "is not a regular file"),
        "over-bytes_in": (FsReadOp(path=f"{r}/small/big.txt"),
                          "is larger than max_bytes_in 16 (set by rule)"),
        "no-overwrite": (FsWriteOp(path=f"{r}/w.txt", bytes_b64=b64(b"y"), overwrite=False),
                         "exists and overwrite is false"),
        "over-a-directory": (FsWriteOp(path=f"{r}/work", bytes_b64=b64(b"y"), overwrite=True),
                             "exists and is not a regular file"),
    }[case]
    dry, ran = world.both(op)
    assert (dry.decision, dry.code) == ("deny", BLOCKED), dry
    assert words in dry.reason
    assert ran.result.code == BLOCKED, ran.result
    assert words in (ran.result.message or "")
    assert ran.result.used.calls == 0  # refused by the guard: nothing opened, nothing charged
    assert (r / "w.txt").read_text() == "x"
    if case == "over-bytes_in":
        assert dry.rule is not None
        assert dry.rule.id == "small"


def test_what_the_executor_accepts_is_still_allowed(world: World) -> None:
    r = world.root
    for op in (FsReadOp(path=f"{r}/small/big.txt", len=16),  # a bounded read fits
               FsReadOp(path=f"{r}/sub2/ok.txt"),
               FsWriteOp(path=f"{r}/w.txt", bytes_b64=b64(b"y"), overwrite=True),
               FsWriteOp(path=f"{r}/work/new.txt", bytes_b64=b64(b"n"), overwrite=False)):
        dry, ran = world.both(op)
        assert dry.allowed, (op, dry)
        assert ran.result.ok, (op, ran.result)
    assert (r / "w.txt").read_text() == "y"


# ---- F6: in-root symlinks are followed as the guard decided them -------------------------------

def test_in_root_symlinks_run_as_explain_decided(world: World) -> None:
    r = world.root
    read = world.both(FsReadOp(path=f"{r}/l_sub/ok.txt"))
    assert read[0].allowed
    assert read[1].result.ok, read[1].result
    assert base64.b64decode(read[1].result.out["bytes_b64"]) == b"in sub2"
    final = world.both(FsReadOp(path=f"{r}/l_w"))
    assert final[0].allowed
    assert base64.b64decode(final[1].result.out["bytes_b64"]) == b"x"
    listing = world.both(FsListOp(path=f"{r}/l_sub", depth=1))
    assert listing[0].allowed
    assert [e["path"] for e in listing[1].result.out["entries"]] == ["ok.txt"]
    write = world.both(FsWriteOp(path=f"{r}/l_sub/n.txt", bytes_b64=b64(b"new")))
    assert write[0].allowed
    assert write[1].result.ok, write[1].result
    assert (r / "sub2" / "n.txt").read_text() == "new"


def test_a_link_into_a_forbidden_directory_is_refused_alike(world: World) -> None:
    dry, ran = world.both(FsReadOp(path=f"{world.root}/l_private/key.txt"))
    assert (dry.code, dry.rule.id if dry.rule else None) == (BLOCKED, "no-private")
    assert ran.result.code == BLOCKED
    assert "PRIVATE" not in str(ran.result.out)


def test_a_link_retargeted_after_the_decision_is_decided_again(world: World) -> None:
    r = world.root
    op = FsReadOp(path=f"{r}/l_sub/key.txt")
    (r / "sub2" / "key.txt").write_text("public copy")
    assert world.explain(op).allowed
    # between the dry run and the run the link is pointed at the forbidden directory
    os.unlink(r / "l_sub")
    os.symlink("private", r / "l_sub")
    ran = world.run(op)
    assert ran.result.code == BLOCKED, ran.result
    assert "forbid rule `no-private`" in (ran.result.message or "")
    assert "PRIVATE" not in str(ran.result.out)


def test_in_root_symlink_read_through_the_cli(world: World, tmp_path: Path) -> None:
    """The finding's own reproduction, through `policy-engine explain` and `run`."""
    import json

    (tmp_path / "m.json").write_text(world.manifest.model_dump_json())
    (tmp_path / "g.json").write_text(world.grant.model_dump_json())
    request = tmp_path / "req.json"
    request.write_text(json.dumps({
        "op": {"kind": "fs.read", "path": f"{world.root}/l_sub/ok.txt"},
        "manifest": "m.json", "grant": "g.json",
        "settings": {"root_fs": str(world.root)}}))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
           "POLICY_ENGINE_STATE": str(tmp_path / "cli-state")}
    outs = {}
    for cmd in ("explain", "run"):
        proc = subprocess.run(
            [sys.executable, "-m", "policy_engine.cli", cmd, "--format", "json",
             "--policy", str(world.policy), "--request", str(request)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs[cmd] = json.loads(proc.stdout)
    assert outs["explain"]["decision"] == "allow"
    assert outs["run"]["result"]["ok"] is True
    assert base64.b64decode(outs["run"]["result"]["out"]["bytes_b64"]) == b"in sub2"


# ---- F12: a cwd whose symlink leads out of the root ---------------------------------------------

PWD = "import os; print(os.getcwd())"


def test_cwd_through_a_symlink_out_of_the_root_is_refused_alike(world: World) -> None:
    op = ProcExecOp(tool="python3", args=["-c", PWD], cwd=f"{world.root}/l_etc")
    dry, ran = world.both(op)
    assert (dry.decision, dry.code) == ("deny", BLOCKED)
    assert "is not beneath root_fs" in dry.reason
    assert ran.result.code == BLOCKED
    assert "is not beneath root_fs" in (ran.result.message or "")
    assert "stdout" not in ran.result.out  # nothing ran in /etc


def test_cwd_through_an_in_root_symlink_runs_in_its_target(world: World) -> None:
    op = ProcExecOp(tool="python3", args=["-c", PWD], cwd=f"{world.root}/l_sub")
    dry, ran = world.both(op)
    assert dry.allowed
    assert ran.result.ok, ran.result
    assert ran.result.out["stdout"].strip() == f"{world.root}/sub2"


NARROW = """policy "t/narrow" version "1.0.0"
defaults {{ timeout 20s  network off }}
permit "read" fs.read paths ["{root}/sub2/**"]
permit "txt" fs.read paths ["{root}/small/*.txt"]
permit "py" proc.exec tool "python3"
"""


@pytest.mark.parametrize("spelling", ["/{root}/sub2", "///{root}//sub2/", "{root}/./sub2"])
def test_a_cwd_spelled_differently_runs_where_explain_said(tmp_path: Path,
                                                           spelling: str) -> None:
    """Outsider round 6, F04: `//w/x` was allowed by explain (the guard normalises paths) and
    refused by the run ("not beneath root_fs": the executor compared the raw string)."""
    for w in make_world(tmp_path, NARROW):
        op = ProcExecOp(tool="python3", args=["-c", PWD], cwd=spelling.format(root=w.root))
        dry, ran = w.both(op)
        assert dry.allowed, dry
        assert ran.result.ok, ran.result
        assert ran.result.out["stdout"].strip() == f"{w.root}/sub2"


@pytest.mark.parametrize("where", ["", "/small", "/l_sub"])
def test_cwd_outside_every_bound_path_is_refused_alike(tmp_path: Path, where: str) -> None:
    """The sandbox binds what the profile's fs globs match (here `sub2`, and the `.txt` files
    of `small`, never `small` itself): a cwd elsewhere is refused by the proc plan, and by the
    guard first."""
    for w in make_world(tmp_path, NARROW):
        op = ProcExecOp(tool="python3", args=["-c", PWD], cwd=f"{w.root}{where}")
        dry, ran = w.both(op)
        if where == "/l_sub":  # the link resolves into the bound `sub2`
            assert dry.allowed
            assert ran.result.out["stdout"].strip() == f"{w.root}/sub2"
            continue
        assert (dry.decision, dry.code) == ("deny", BLOCKED)
        assert "is not a readable path of the profile" in dry.reason
        assert ran.result.code == BLOCKED
        assert ran.result.used.calls == 0
