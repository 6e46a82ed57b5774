"""The engine's state directory is refused to every guarded op (guard/engine_state.py, attack 36):
fs paths as resolved and as written, a proc.exec's cwd, a tmp.alloc's tmp dir; the workspaces
beneath it stay open; traced and untraced answer alike; no memo of the guard lets a path through
once the same path was decided elsewhere; the fs executor re-checks it as a second line."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

from plugins.executor_fs.executor import FsExecutor, FsOptions
from policy_engine.errors import PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.guard.engine_state import ENGINE_STATE_ID, EngineState
from policy_engine.model import (
    FsListOp,
    FsReadOp,
    FsWriteOp,
    ProcCapability,
    ProcExecOp,
    Profile,
    TmpAllocOp,
    TmpCapability,
)
from tests.unit.guard_fixtures import NOW, fs, make_profile, permit

BLOCKED = "SANDBOX.CAPABILITY_BLOCKED"


def _world(tmp_path: Path) -> tuple[Path, Path, Profile]:
    proj = tmp_path / "proj"
    state = proj / "var"
    for d in (state / "keys", state / "run_code" / "s1", state / "workspace" / "t", proj / "src"):
        d.mkdir(parents=True)
    (state / "keys" / "evidence-hmac.key").write_bytes(b"k" * 32)
    (state / "tokens.sqlite").write_bytes(b"db")
    (state / "run_code" / "s1" / "a.txt").write_text("ws")
    (proj / "src" / "a.txt").write_text("src")
    (proj / "link").symlink_to(state)
    (state / "run_code" / "s1" / "out").symlink_to(state / "keys")
    caps = (*(permit(k, fs(k, f"{proj}/**")) for k in ("fs.read", "fs.write", "fs.list")),
            permit("proc.exec", ProcCapability(kind="proc.exec", tool="bash")),
            permit("tmp.use", TmpCapability(kind="tmp.use")))
    return proj, state, make_profile(capabilities=caps, root_fs=str(proj),
                                     tmp_dir=str(state / "tmp"))


def _write(path: Path) -> FsWriteOp:
    return FsWriteOp(path=str(path), bytes_b64=base64.b64encode(b"x").decode(), overwrite=True)


@pytest.mark.parametrize("trace", [False, True])
def test_every_kind_is_refused_in_the_state_dir(tmp_path: Path, trace: bool) -> None:
    proj, state, profile = _world(tmp_path)
    guard = Guard(state_dir=state)
    plain = Guard()
    refused = [FsReadOp(path=f"{state}/keys/evidence-hmac.key"), _write(state / "tokens.sqlite"),
               FsListOp(path=str(state)), FsReadOp(path=f"{proj}/link/tokens.sqlite"),
               FsReadOp(path=f"{state}/run_code/s1/out/evidence-hmac.key"),  # link out of it
               FsListOp(path=f"{state}/run_code"),  # the list of every session
               ProcExecOp(tool="bash", args=("-c", "true"), cwd=f"{state}/keys"),
               ProcExecOp(tool="bash", args=("-c", "true"), cwd=f"{proj}/link"),
               TmpAllocOp(size_bytes=10)]
    for op in refused:
        # the policy alone allows each one: only the state dir refuses it
        assert plain.decide(profile, op, now_ms=NOW).decision == "allow", op
        d = guard.decide(profile, op, now_ms=NOW, trace=trace)
        assert d.decision == "deny", op
        assert d.code == BLOCKED, (op, d.reason)
        assert d.rule is not None, (op, d.reason)
        assert d.rule.id == ENGINE_STATE_ID, (op, d.reason)
        assert "engine's state directory" in d.reason
        if trace:
            assert any(s.rule is not None and s.rule.id == ENGINE_STATE_ID
                       for s in d.trace or ()), d.trace
    for op in (FsReadOp(path=f"{state}/run_code/s1/a.txt"), _write(state / "workspace/t/n.txt"),
               FsReadOp(path=f"{proj}/src/a.txt"),
               ProcExecOp(tool="bash", args=("-c", "true"), cwd=f"{state}/run_code/s1")):
        assert guard.decide(profile, op, now_ms=NOW, trace=trace).decision == "allow", op


def test_no_memo_answers_for_the_state_dir(tmp_path: Path) -> None:
    """The same compiled profile decided first by a guard without the fact, then with it, and
    the same path twice (the forbid, refusal and deny memos): the fact is asked every time."""
    _, state, profile = _world(tmp_path)
    key = FsReadOp(path=f"{state}/keys/evidence-hmac.key")
    plain = Guard()
    guarded = Guard(state_dir=state)
    for _ in range(3):
        assert plain.decide(profile, key, now_ms=NOW).decision == "allow"
        assert guarded.decide(profile, key, now_ms=NOW).code == BLOCKED
    # copies of the guard keep it (the listing's entry filter, declared facts)
    assert guarded.policy_only().decide(profile, key, now_ms=NOW).code == BLOCKED
    copy = Guard(state_dir=state).policy_only()
    assert copy.decide(profile, FsListOp(path=str(state)), now_ms=NOW).code == BLOCKED


def test_the_state_dir_is_known_by_its_real_path_too(tmp_path: Path) -> None:
    real = tmp_path / "real-state"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    state = EngineState(tmp_path / "alias")
    assert state.covers(f"{real}/keys/k")
    assert state.covers(f"{tmp_path}/alias/tokens.sqlite")
    assert state.covers(str(real))
    assert not state.covers(f"{real}-other/x")  # segment-wise, not a string prefix
    assert not state.covers(f"{real}/run_code/s/x")
    assert state.covers(f"{real}/run_code")
    assert not state.covers(f"{real}/workspace/t/x")
    assert state.covers(f"{real}/workspace")


def test_the_fs_executor_refuses_it_as_a_second_line(tmp_path: Path) -> None:
    """An executor driven with the guard's fact refuses a path the guard was not asked about
    (a link swapped in after the decision lands the same way: the executor resolves it)."""
    _, state, profile = _world(tmp_path)
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 30,
                      guard=Guard(state_dir=state))
    with pytest.raises(PolicyEngineError) as exc:
        FsExecutor(FsOptions()).execute(ctx, FsReadOp(path=f"{state}/keys/evidence-hmac.key"))
    assert exc.value.code.value == BLOCKED
    assert "engine's state directory" in exc.value.reason
    ok = FsExecutor(FsOptions()).execute(ctx, FsReadOp(path=f"{state}/run_code/s1/a.txt"))
    assert ok.ok
