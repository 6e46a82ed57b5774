"""Dry run equals run on what a CEL condition sees: the gateway's dry run (``Gateway.decide``,
what `/v1/decide` answers) hands the guard the call's own context, as the run does, and both
read the same per-profile ``grant``/``manifest``/``tenant``/``subject`` views.

It used to build its own context from the grant and manifest documents as sent, over what the
caller's context said: the manifest's side effects in the order and with the repeats the caller
wrote (the run's view has them sorted and once each), and its own ``grant`` even when the
caller's context gave one (the run takes the caller's), so a condition reading them decided one
way in the dry run and the other way in the run. Each op here is decided by the dry
run and then run for real (the fs executor reads a real file) and the two must agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.explain import ExplainRequest
from policy_engine.gateway.call import Call, Gateway
from policy_engine.model import FsListOp, FsReadOp, Grant, Manifest, Settings
from policy_engine.orchestrator import Orchestrator

pytestmark = pytest.mark.integration

POLICY = """policy "views/dry" version "1.0.0"
permit "effects" fs.list paths ["{root}/data/**"]
  when `manifest.side_effects[1] == "Read" && size(manifest.side_effects) == 2`
permit "caller" fs.read paths ["{root}/data/**"] when `grant.call_id == "from-context"`
permit "teams" fs.read paths ["{root}/data/**"] when `subject.team == "red"`
"""


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello.txt").write_text("hello\n")
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(POLICY.format(root=tmp_path))
    orch = Orchestrator(compile_files([policy]),
                        config=EngineConfig(state_dir=tmp_path / "state"))
    yield Gateway(orch)
    orch.close()


def _call(root: Path) -> tuple[Grant, Manifest]:
    caps = [{"kind": "fs.read", "paths": [f"{root}/data/**"]},
            {"kind": "fs.list", "paths": [f"{root}/data/**"]}]
    grant = Grant.model_validate({"tenant": "acme", "subject_id": "agent:x",
                                  "tool_name": "reader", "call_id": "c1",
                                  "expires_at": 4102444800000, "capabilities": caps})
    manifest = Manifest.model_validate({"name": "reader", "version": "1.0.0",
                                        "side_effects": ["Read", "Network", "Read"],
                                        "permissions": caps})
    return grant, manifest


@pytest.mark.parametrize(("op", "context"), [
    ("list", {}),  # side effects sorted and once each in the view: [Network, Read]: allowed
    ("read", {}),  # no caller's grant nor subject: denied by both
    ("read", {"grant": {"call_id": "from-context"}}),  # the caller's grant view: allowed
    ("read", {"subject": {"id": "agent:x", "team": "red"}}),  # the caller's subject: allowed
    ("read", {"subject": {"id": "agent:x", "team": "blue"}}),  # denied by both
])
def test_dry_run_sees_what_the_run_sees(gateway: Gateway, tmp_path: Path, op: str,
                                        context: dict[str, dict[str, str]]) -> None:
    grant, manifest = _call(tmp_path)
    the_op = FsReadOp(kind="fs.read", path=f"{tmp_path}/data/hello.txt") if op == "read" \
        else FsListOp(kind="fs.list", path=f"{tmp_path}/data")
    settings = Settings(root_fs=str(tmp_path))
    for trace in (False, True):
        dry = gateway.decide(manifest, grant, ExplainRequest(op=the_op, settings=settings,
                                                             context=context), trace=trace)
        ran = gateway.run(Call(grant, manifest, the_op, settings=settings,
                               context=context or None))
        assert dry.decision.decision == ran.outcome.decision.decision, (trace, dry.decision,
                                                                       ran.outcome.decision)
        assert dry.decision.code == ran.outcome.decision.code
        assert (dry.decision.rule.id if dry.decision.rule else None) == \
            (ran.outcome.decision.rule.id if ran.outcome.decision.rule else None)
        assert ran.ok == (dry.decision.decision == "allow")
    allowed = op == "list" or "grant" in context or \
        context.get("subject", {}).get("team") == "red"
    assert dry.decision.decision == ("allow" if allowed else "deny")
