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


def _home_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Profile]:
    """An agent rooted at a home directory, permitted to read, list and write all of it."""
    home = tmp_path / "home"
    for d in (".cache/policy-engine/bin", ".cache/pip", ".config/policy-engine", ".local/bin",
              "notes"):
        (home / d).mkdir(parents=True)
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "POLICY_ENGINE_STATE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    caps = tuple(permit(k, fs(k, f"{home}/**")) for k in ("fs.read", "fs.write", "fs.list"))
    return home, make_profile(capabilities=caps, root_fs=str(home), tmp_dir=str(home / "tmp"))


@pytest.mark.parametrize("trace", [False, True])
def test_the_engines_cache_and_the_trees_it_runs_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: bool) -> None:
    """Outsider attack 38: an fs op runs as the engine's uid, so what it writes in the engine's
    cache (the parser's pickle, the stored mask walks, the launcher) or the trees the engine or
    the next login runs passes every "only this user wrote it" check. Refused whatever the
    policy permits; the cache to every op, the others to writes."""
    home, profile = _home_world(tmp_path, monkeypatch)
    guard = Guard(state_dir=tmp_path / "state")
    cache = home / ".cache" / "policy-engine"
    refused = [_write(cache / "sbpolicy-grammar-0.lark"), _write(cache / "mask-walks-py311.bin"),
               _write(cache / "bin" / "sb_launch-0"), _write(cache),
               FsReadOp(path=str(cache / "mask-walks-py311.bin")), FsListOp(path=str(cache)),
               _write(home / ".config" / "policy-engine" / "sandbox.json"),
               _write(home / ".local" / "bin" / "ls"),
               _write(home / ".config" / "autostart" / "x.desktop")]
    for op in refused:
        d = guard.decide(profile, op, now_ms=NOW, trace=trace)
        assert d.code == BLOCKED, (op, d)
        assert d.rule is not None
        assert d.rule.id == ENGINE_STATE_ID, (op, d)
        assert "no policy" in (d.reason or ""), d
    allowed = [_write(home / ".cache" / "pip" / "x"), _write(home / "notes" / "a.txt"),
               FsReadOp(path=str(home / ".config" / "policy-engine" / "sandbox.json")),
               FsListOp(path=str(home / ".cache"))]
    (home / ".config" / "policy-engine" / "sandbox.json").write_text("{}")
    for op in allowed:
        assert guard.decide(profile, op, now_ms=NOW, trace=trace).allowed, op
    # a pure policy guard (no engine: tests, analysis) refuses none of it
    assert Guard().decide(profile, refused[0], now_ms=NOW).allowed


def test_the_fs_executor_refuses_the_engines_trees_as_a_second_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, profile = _home_world(tmp_path, monkeypatch)
    guard = Guard(state_dir=tmp_path / "state")
    ex = FsExecutor(FsOptions())
    launcher = home / ".cache" / "policy-engine" / "bin" / "sb_launch-0"
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 10, guard=guard)
    with pytest.raises(PolicyEngineError) as exc:  # an executor asked directly, guard skipped
        ex.execute(ctx, _write(launcher))
    assert exc.value.code.value == BLOCKED
    assert "native launcher" in exc.value.reason or "engine's cache" in exc.value.reason
    assert not launcher.exists()


def test_the_three_spellings_of_the_engine_cache_agree(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """The guard refuses ``enginedirs.engine_cache_dir``; the parser cache and the walk store
    each spell the same directory (a lower floor cannot import enginedirs)."""
    import os

    from policy_engine.dsl import grammar_cache
    from policy_engine.sandbox import enginedirs, listing_store
    for env in ({"HOME": str(tmp_path / "h")},
                {"HOME": str(tmp_path / "h"), "XDG_CACHE_HOME": str(tmp_path / "xdg")},
                {"HOME": str(tmp_path / "h"), "POLICY_ENGINE_STATE": str(tmp_path / "st")}):
        for var in ("XDG_CACHE_HOME", "POLICY_ENGINE_STATE", listing_store.DISABLE_ENV):
            monkeypatch.delenv(var, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        expected = enginedirs.engine_cache_dir(os.environ)
        assert str(grammar_cache.cache_dir()) == expected
        store = listing_store.store_path()
        assert store is not None
        assert os.path.dirname(store) == expected
