"""A root, a HOME or a forbid given through a symlink keeps every forbid (outsider rounds 10, 11).

The guard resolves symlinks beneath the fs root and trusted the root itself, so with ``root_fs``
a link (``/ws`` → ``/home/alice``) it decided ``/ws/.ssh/id_ed25519`` as written, the mandatory
deny on the real ``/home/alice/.ssh/**`` never matched, ``explain`` allowed and the fs executor,
opening the root through its link, read the key (round 10, F4). Resolving the root's real name
once was not enough: re-pointed later, or between the decision and the open, the run read the
key again (round 11, F1/F3). A root that is not its own real path is now refused, by the guard
and by the fs executor on the directory it opened. With ``HOME`` a link, ``~/.ssh/**`` did not
cover the real ``.ssh`` an op path resolves to (round 10, F5), and a forbid spelt through a link
stopped covering even its own spelling once resolved (round 11, F4): forbids see the path as
written too, and a linked pattern's real name when the forbids compile. Each case runs
``explain`` and the real run through the orchestrator and the fs executor; the planted key must
never come back.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.explain import explain
from policy_engine.explain.request import ExplainRequest
from policy_engine.graph import PolicySet
from policy_engine.model import (
    Decision,
    ExecResult,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    Settings,
)
from policy_engine.orchestrator import Orchestrator, RunOutcome

pytestmark = pytest.mark.integration
BLOCKED = "SANDBOX.CAPABILITY_BLOCKED"
KEY = b"PLANTED-KEY-7f3a9c"
CAPS: list[dict[str, Any]] = [{"kind": k, "paths": ["/**"]}
                              for k in ("fs.read", "fs.list", "fs.write")]
GRANT = Grant.model_validate({
    "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
    "capabilities": CAPS, "expires_at": 4_102_444_800_000,
    "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4_102_444_800_000}})
MANIFEST = Manifest.model_validate({
    "name": "tool", "version": "1.0.0", "permissions": CAPS, "side_effects": ["Read", "Write"],
    "safety_class": "Low"})
POLICY = """policy "t/links" version "1.0.0"
defaults {{ timeout 20s  network off }}
permit "all" fs.read, fs.list, fs.write paths ["{base}/**"]
forbid "no-private" fs.read, fs.write paths ["{base}/cur/private/**"]
"""


@dataclass
class World:
    base: Path
    real: Path  # the home directory itself
    link: Path  # a symlink to it

    def policy(self, home: Path) -> PolicySet:
        policy = self.base / "p.sbpolicy"
        policy.write_text(POLICY.format(base=self.base))
        return compile_files([policy], home=str(home))

    def orchestrator(self) -> Orchestrator:
        return Orchestrator(self.policy(self.real),
                            config=EngineConfig(state_dir=self.base / "state",
                                                revocation="memory"))

    def decide_and_run(self, op: Any, *, root_fs: Path, home: Path,
                       tmp_dir: Path | None = None) -> tuple[Decision, RunOutcome]:
        policyset = self.policy(home)
        settings = _settings(root_fs, tmp_dir)
        decision = explain(policyset, MANIFEST, GRANT,
                           ExplainRequest(op=op, settings=settings)).decision
        config = EngineConfig(state_dir=self.base / "state", revocation="memory")
        with Orchestrator(policyset, config=config) as orch:
            outcome = orch.run(GRANT, MANIFEST, op, settings=settings)
        return decision, outcome


def _settings(root_fs: Path, tmp_dir: Path | None = None) -> Settings:
    return Settings(root_fs=str(root_fs), **({"tmp_dir": str(tmp_dir)} if tmp_dir else {}))


@pytest.fixture
def world(tmp_path: Path) -> World:
    real = tmp_path / "home" / "alice"
    (real / ".ssh").mkdir(parents=True)
    (real / ".ssh" / "id_ed25519").write_bytes(KEY)
    (real / "work").mkdir()
    (real / "work" / "ok.txt").write_text("fine")
    for version in ("v1", "v2"):
        (tmp_path / version / "private").mkdir(parents=True)
        (tmp_path / version / "private" / "n.txt").write_bytes(KEY)
    os.symlink("v1", tmp_path / "cur")
    link = tmp_path / "alicelink"
    os.symlink(real, link)
    os.symlink(tmp_path / "home", tmp_path / "homelink")
    return World(tmp_path, real, link)


def _no_key(result: ExecResult, *more: Any) -> None:
    # the key's bytes (or their base64) reach neither the result nor the evidence
    for out in (result, *more):
        text = out.model_dump_json()
        assert KEY.decode() not in text
        assert base64.b64encode(KEY).decode() not in text


def _refused(decision: Decision, outcome: RunOutcome, rule: str | None, why: str = "") -> None:
    assert (decision.decision, decision.code) == ("deny", BLOCKED), decision.reason
    assert (decision.rule.id if decision.rule else None) == rule, decision.reason
    assert why in decision.reason
    assert not outcome.result.ok
    assert outcome.result.code == BLOCKED
    _no_key(outcome.result, outcome.begin, outcome.end)


@pytest.mark.parametrize("name", [".ssh/id_ed25519", ".ssh", ".ssh/new_key"])
def test_a_root_given_through_a_link_is_refused(world: World, name: str) -> None:
    # round 10, F4: root_fs is the link, HOME the real home
    path = f"{world.link}/{name}"
    op = FsWriteOp(path=path, bytes_b64="eA==") if name.endswith("new_key") else (
        FsListOp(path=path) if name == ".ssh" else FsReadOp(path=path))
    decision, outcome = world.decide_and_run(op, root_fs=world.link, home=world.real)
    _refused(decision, outcome, None, f"`{world.link}` has a symlink on its path (it is "
                                      f"`{world.real}`): configure its real path")
    assert not (world.real / ".ssh" / "new_key").exists()


def test_the_same_files_under_the_real_root_are_decided_as_always(world: World) -> None:
    decision, outcome = world.decide_and_run(FsReadOp(path=f"{world.real}/.ssh/id_ed25519"),
                                             root_fs=world.real, home=world.real)
    _refused(decision, outcome, "builtin:mandatory-secrets")
    decision, outcome = world.decide_and_run(FsReadOp(path=f"{world.real}/work/ok.txt"),
                                             root_fs=world.real, home=world.real)
    assert decision.decision == "allow", decision.reason
    assert outcome.result.ok, outcome.result


def test_a_root_linked_to_slash_is_refused(world: World) -> None:
    link = world.base / "rootlink"
    os.symlink("/", link)
    decision, outcome = world.decide_and_run(FsReadOp(path=f"{link}/etc/shadow"),
                                             root_fs=link, home=world.real)
    _refused(decision, outcome, None, "has a symlink on its path (it is `/`)")


def test_a_tmp_dir_given_through_a_link_is_refused(world: World) -> None:
    root = world.base / "elsewhere"
    root.mkdir()
    decision, outcome = world.decide_and_run(
        FsWriteOp(path=f"{world.link}/.ssh/new.txt", bytes_b64="eA=="),
        root_fs=root, home=world.real, tmp_dir=world.link)
    _refused(decision, outcome, None, "the tmp dir")
    assert not (world.real / ".ssh" / "new.txt").exists()


def test_a_root_swapped_for_a_link_after_its_profile_was_compiled_is_refused(
        world: World) -> None:
    # round 11, F1: a long-lived engine (serve) keeps its compiled profile
    root = world.base / "ws"
    (root / ".ssh").mkdir(parents=True)
    (root / ".ssh" / "decoy").write_text("decoy")
    (root / "a.txt").write_text("a")
    settings = _settings(root)
    with world.orchestrator() as orch:
        first = orch.run(GRANT, MANIFEST, FsReadOp(path=f"{root}/a.txt"), settings=settings)
        assert first.result.ok, first.result
        root.rename(world.base / "ws-old")
        os.symlink(world.real, root)  # the root is now a link to the home directory
        for op in (FsReadOp(path=f"{root}/.ssh/id_ed25519"), FsReadOp(path=f"{root}/a.txt"),
                   FsListOp(path=f"{root}/.ssh")):
            outcome = orch.run(GRANT, MANIFEST, op, settings=settings)
            assert not outcome.result.ok, op
            assert outcome.result.code == BLOCKED, outcome.result
            _no_key(outcome.result, outcome.begin, outcome.end)


def test_a_home_given_through_a_link_keeps_the_mandatory_denies(world: World) -> None:
    # round 10, F5: root_fs the real directory, HOME spelt through a link
    home = world.base / "homelink" / "alice"
    for path in (f"{world.real}/.ssh/id_ed25519", f"{home}/.ssh/id_ed25519"):
        decision, outcome = world.decide_and_run(FsReadOp(path=path), root_fs=world.base,
                                                 home=home)
        _refused(decision, outcome, "builtin:mandatory-secrets")


def test_links_re_pointed_after_compiling_keep_their_forbids(world: World) -> None:
    # round 11, F4: one orchestrator; a forbid spelt through `cur`, HOME through `homelink`
    home = world.base / "homelink" / "alice"
    other = world.base / "home2" / "alice"
    (other / ".ssh").mkdir(parents=True)
    (other / ".ssh" / "id_ed25519").write_bytes(KEY)
    settings = _settings(world.base)
    policyset = world.policy(home)
    config = EngineConfig(state_dir=world.base / "state", revocation="memory")
    with Orchestrator(policyset, config=config) as orch:
        first = orch.run(GRANT, MANIFEST, FsReadOp(path=f"{world.base}/cur/private/n.txt"),
                         settings=settings)
        assert first.result.code == BLOCKED  # compiled while cur -> v1, homelink -> home
        os.remove(world.base / "cur")
        os.symlink("v2", world.base / "cur")
        os.remove(world.base / "homelink")
        os.symlink(world.base / "home2", world.base / "homelink")
        # the spellings the policy wrote hold at every decision; the real name behind a
        # re-pointed HOME link (`other`) is read when the forbids compile again (docs/cli.md):
        # a fresh compilation (explain, a reload) denies it, checked below
        fresh = explain(policyset, MANIFEST, GRANT, ExplainRequest(
            op=FsReadOp(path=f"{other}/.ssh/id_ed25519"), settings=settings)).decision
        assert fresh.rule is not None
        assert fresh.rule.id == "builtin:mandatory-secrets", fresh.reason
        for path, rule in ((f"{world.base}/cur/private/n.txt", "no-private"),
                           (f"{home}/.ssh/id_ed25519", "builtin:mandatory-secrets")):
            op = FsReadOp(path=path)
            outcome = orch.run(GRANT, MANIFEST, op, settings=settings)
            assert outcome.result.code == BLOCKED, (path, outcome.result)
            assert outcome.decision.rule is not None
            assert outcome.decision.rule.id == rule, (path, outcome.decision.reason)
            _no_key(outcome.result, outcome.begin, outcome.end)
            fresh = explain(policyset, MANIFEST, GRANT,
                            ExplainRequest(op=op, settings=settings)).decision
            assert (fresh.decision, fresh.rule.id if fresh.rule else None) == ("deny", rule)


def test_a_root_flipping_between_a_directory_and_a_link_is_refused_with_a_stable_code(
        world: World) -> None:
    # round 12, F3: realpath of a root swapped mid-read raised (EINVAL), and the guard answered
    # UNKNOWN.INTERNAL; now CAPABILITY_BLOCKED ("changed while it was being resolved") or the
    # usual answer, and the planted key never comes back
    root = world.base / "ws"
    (root / ".ssh").mkdir(parents=True)
    (root / ".ssh" / "id_ed25519").write_text("decoy")
    os.symlink(world.real, world.base / "wslink")
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():  # RENAME_EXCHANGE: the root is the directory or the link
            libc.renameat2(-100, str(root).encode(), -100, str(world.base / "wslink").encode(), 2)
            time.sleep(0.0005)

    codes: set[str | None] = set()
    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        with world.orchestrator() as orch:
            for _ in range(150):
                for op in (FsReadOp(path=f"{root}/.ssh/id_ed25519"), FsListOp(path=f"{root}/.ssh")):
                    outcome = orch.run(GRANT, MANIFEST, op, settings=_settings(root))
                    codes.add(outcome.result.code)
                    _no_key(outcome.result, outcome.begin, outcome.end)
    finally:
        stop.set()
        flipper.join()
    assert codes <= {None, BLOCKED}, codes


@pytest.mark.parametrize("root", ["ws", "./ws/", "/ws/sub/..", "/ws/./x", "/ws\x00/x"])
def test_a_root_that_is_not_an_absolute_plain_path_is_refused_up_front(world: World,
                                                                       root: str) -> None:
    # round 12, F4/F5: a relative root was decided against nothing (explain allowed, the fs
    # executor refused); a `..` in it reads one way lexically and another through a link
    with pytest.raises(ValidationError, match="absolute path without"):
        Settings(root_fs=root)
    with pytest.raises(ValidationError, match="absolute path without"):
        Settings(tmp_dir=root)


def test_the_cli_answers_a_relative_root_with_a_clear_error(world: World) -> None:
    (world.base / "r.json").write_text(json.dumps({
        "op": {"kind": "fs.read", "path": "ws/a.txt"}, "settings": {"root_fs": "ws"},
        "manifest": MANIFEST.model_dump(mode="json"), "grant": GRANT.model_dump(mode="json")}))
    world.policy(world.real)
    proc = subprocess.run([sys.executable, "-m", "policy_engine.cli", "explain", "--policy",
                           str(world.base / "p.sbpolicy"), "--request",
                           str(world.base / "r.json")],
                          capture_output=True, text=True, timeout=60, cwd=world.base,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "root_fs" in proc.stderr + proc.stdout
    assert "absolute path without" in proc.stderr + proc.stdout
