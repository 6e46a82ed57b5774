"""A root or home given through a symlink keeps every forbid (outsider round 10, F4 and F5).

The guard resolves symlinks beneath the fs root and trusts the root itself, so with ``root_fs``
a link (``/ws`` → ``/home/alice``) it decided ``/ws/.ssh/id_ed25519`` as written, the mandatory
deny on the real ``/home/alice/.ssh/**`` never matched, ``explain`` allowed and the fs executor,
opening the root through its link, read the key (F4). With ``HOME`` a link and ``root_fs`` the
real directory, the path was resolved to its real location while ``~/.ssh/**`` was expanded
with the link's spelling: the same read (F5). Each case runs ``explain`` and then the real run
through the orchestrator and the fs executor; the planted key must never come back.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.explain import explain
from policy_engine.explain.request import ExplainRequest
from policy_engine.model import (
    Decision,
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
POLICY = """policy "t/links" version "1.0.0"
defaults {{ timeout 20s  network off }}
permit "all" fs.read, fs.list, fs.write paths ["{base}/**"]
forbid "no-private" fs.read, fs.write paths ["{real}/private/**"]
"""


@dataclass
class World:
    base: Path
    real: Path  # the home directory itself
    link: Path  # a symlink to it

    def decide_and_run(self, op: Any, *, root_fs: Path, home: Path,
                       tmp_dir: Path | None = None) -> tuple[Decision, RunOutcome]:
        policy = self.base / "p.sbpolicy"
        policy.write_text(POLICY.format(base=self.base, real=self.real))
        policyset = compile_files([policy], home=str(home))
        grant = Grant.model_validate({
            "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
            "capabilities": CAPS, "expires_at": 4_102_444_800_000,
            "consent": {"granted_by": "user:u", "granted_at": 1,
                        "expires_at": 4_102_444_800_000}})
        manifest = Manifest.model_validate({
            "name": "tool", "version": "1.0.0", "permissions": CAPS,
            "side_effects": ["Read", "Write"], "safety_class": "Low"})
        settings = Settings(root_fs=str(root_fs),
                            **({"tmp_dir": str(tmp_dir)} if tmp_dir else {}))
        decision = explain(policyset, manifest, grant,
                           ExplainRequest(op=op, settings=settings)).decision
        config = EngineConfig(state_dir=self.base / "state", revocation="memory")
        with Orchestrator(policyset, config=config) as orch:
            outcome = orch.run(grant, manifest, op, settings=settings)
        return decision, outcome


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    real = tmp_path / "home" / "alice"
    (real / ".ssh").mkdir(parents=True)
    (real / ".ssh" / "id_ed25519").write_bytes(KEY)
    (real / "private").mkdir()
    (real / "private" / "notes.txt").write_bytes(KEY)
    (real / "work").mkdir()
    (real / "work" / "ok.txt").write_text("fine")
    link = tmp_path / "alicelink"
    os.symlink(real, link)
    os.symlink(tmp_path / "home", tmp_path / "homelink")
    yield World(tmp_path, real, link)


def _refused(decision: Decision, outcome: RunOutcome, rule: str) -> None:
    assert (decision.decision, decision.code) == ("deny", BLOCKED), decision.reason
    assert decision.rule is not None and decision.rule.id == rule, decision.reason
    assert not outcome.result.ok
    assert outcome.result.code == BLOCKED
    # the key's bytes (or their base64) reach neither the result nor the evidence
    for out in (outcome.result, outcome.begin, outcome.end):
        text = out.model_dump_json()
        assert KEY.decode() not in text and base64.b64encode(KEY).decode() not in text


@pytest.mark.parametrize("name", [".ssh/id_ed25519", ".ssh", ".ssh/new_key"])
def test_a_root_given_through_a_link_keeps_the_mandatory_denies(world: World, name: str) -> None:
    # F4: root_fs is the link, HOME the real home
    path = f"{world.link}/{name}"
    op = FsWriteOp(path=path, bytes_b64="eA==") if name.endswith("new_key") else (
        FsListOp(path=path) if name == ".ssh" else FsReadOp(path=path))
    decision, outcome = world.decide_and_run(op, root_fs=world.link, home=world.real)
    _refused(decision, outcome, "builtin:mandatory-secrets")
    assert str(world.real / ".ssh") in decision.reason  # it names where the path really is


def test_a_root_given_through_a_link_keeps_the_policy_forbids(world: World) -> None:
    decision, outcome = world.decide_and_run(FsReadOp(path=f"{world.link}/private/notes.txt"),
                                             root_fs=world.link, home=world.real)
    _refused(decision, outcome, "no-private")


def test_a_home_given_through_a_link_keeps_the_mandatory_denies(world: World) -> None:
    # F5: root_fs is the real directory, HOME spelt through a link
    home = world.base / "homelink" / "alice"
    for root in (world.real, world.link):
        decision, outcome = world.decide_and_run(
            FsReadOp(path=f"{root}/.ssh/id_ed25519"), root_fs=root, home=home)
        _refused(decision, outcome, "builtin:mandatory-secrets")


def test_a_tmp_dir_given_through_a_link_keeps_the_forbids(world: World) -> None:
    root = world.base / "elsewhere"
    root.mkdir()
    decision, outcome = world.decide_and_run(
        FsWriteOp(path=f"{world.link}/private/new.txt", bytes_b64="eA=="),
        root_fs=root, home=world.real, tmp_dir=world.link)
    _refused(decision, outcome, "no-private")
    assert not (world.real / "private" / "new.txt").exists()


def test_what_is_allowed_through_a_linked_root_still_runs(world: World) -> None:
    decision, outcome = world.decide_and_run(FsReadOp(path=f"{world.link}/work/ok.txt"),
                                             root_fs=world.link, home=world.real)
    assert decision.decision == "allow", decision.reason
    assert outcome.result.ok, outcome.result


def test_a_root_linked_to_slash_keeps_the_host_denies(world: World) -> None:
    # the attacker's variant: root_fs a link to `/`, the mandatory deny on /etc/shadow
    link = world.base / "rootlink"
    os.symlink("/", link)
    decision, outcome = world.decide_and_run(FsReadOp(path=f"{link}/etc/shadow"),
                                             root_fs=link, home=world.real)
    assert (decision.decision, decision.code) == ("deny", BLOCKED), decision.reason
    assert decision.rule is not None and decision.rule.id == "builtin:mandatory-secrets"
    assert "(really `/etc/shadow`)" in decision.reason
    assert not outcome.result.ok and outcome.result.code == BLOCKED
