"""No hidden ceilings (issue 10 item 2): built-in limits are defaults a policy may raise, every
effective limit names the layer that set it, and `explain` blames a rule only for its own limits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.errors import PolicyEngineError
from policy_engine.explain import ExplainRequest, explain
from policy_engine.explain.render_text import render_text
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.model import (
    LIMIT_FIELDS,
    LIMIT_LAYERS,
    SYSTEM_DEFAULT_LIMITS,
    FsCapability,
    FsListOp,
    Grant,
    Limits,
    Manifest,
    Overrides,
    ProcCapability,
    ProcExecOp,
    Settings,
)
from policy_engine.profile import ProfileBuilder

FAR = 4_102_444_800_000
BIG = """defaults { timeout 5m  network off  limits { depth 20  memory 4GiB } }
permit "ls" fs.list paths ["/w/**", "/w"]
"""
RULES = """defaults { network off  limits { depth 5 } }
permit "long" proc.exec tool "make" limits { timeout 5m  memory 2GiB }
permit "deep" fs.list paths ["/w/deep/**"] limits { depth 9  files 7 }
permit "ls" fs.list paths ["/w/**", "/w"]
"""


def compile_text(tmp_path: Path, text: str) -> PolicySet:
    path = tmp_path / "p.sbpolicy"
    path.write_text('policy "t" version "1.0.0"\n' + text)
    return compile_files([path])


def tool(manifest_limits: Limits | None = None,
         grant_limits: Limits | None = None) -> tuple[Manifest, Grant]:
    caps = (FsCapability(kind="fs.list", paths=("/**",)), ProcCapability(tool="make"))
    manifest = Manifest(name="t", version="1", permissions=caps,
                        limits=manifest_limits or Limits())
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="t", call_id="c",
                  capabilities=caps, expires_at=FAR, limits=grant_limits or Limits())
    return manifest, grant


def test_policy_defaults_above_the_built_ins_are_honoured(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, BIG)
    manifest, grant = tool()
    profile = ProfileBuilder(ps).build(grant, manifest)
    assert profile.limits.timeout_ms == 300_000 > (SYSTEM_DEFAULT_LIMITS.timeout_ms or 0)
    assert profile.limits.max_depth == 20
    assert profile.limits.memory_bytes == 4 * 1024**3
    assert profile.limit_layers["timeout_ms"] == "policy default"
    assert profile.limit_layers["max_files"] == "built-in"
    d = Guard(ps).decide(profile, FsListOp(path="/w", depth=15), now_ms=0)
    assert d.allowed, d.reason
    assert d.limits is not None
    assert d.limits.max_depth == 20
    assert set(d.limits.model_dump(exclude_none=True)) == set(LIMIT_FIELDS)


def test_a_rule_replaces_a_built_in_but_meets_a_policy_default(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, RULES)
    manifest, grant = tool()
    profile = ProfileBuilder(ps).build(grant, manifest)
    guard = Guard(ps)
    long = guard.decide(profile, ProcExecOp(tool="make"), now_ms=0)
    assert long.limits is not None
    assert long.limit_layers is not None
    assert long.limits.timeout_ms == 300_000
    assert long.limit_layers["timeout_ms"] == "rule"
    assert long.limits.memory_bytes == 2 * 1024**3
    # the policy default depth 5 is a ceiling for rules: depth 9 is met down to 5
    deep = guard.decide(profile, FsListOp(path="/w/deep/x", depth=2), now_ms=0)
    assert deep.limits is not None
    assert deep.limit_layers is not None
    assert deep.limits.max_depth == 5
    assert deep.limit_layers["max_depth"] == "policy default"
    assert deep.limits.max_files == 7
    assert deep.limit_layers["max_files"] == "rule"
    assert set((deep.limit_layers or {}).values()) <= set(LIMIT_LAYERS)


def test_narrowing_layers_and_the_op_are_named(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, RULES)
    manifest, grant = tool(Limits(timeout_ms=120_000), Limits(memory_bytes=1024**3))
    profile = ProfileBuilder(ps).build(grant, manifest)
    d = Guard(ps).decide(profile, ProcExecOp(tool="make", timeout_ms=5_000), now_ms=0)
    assert d.limits is not None
    assert d.limit_layers is not None
    assert d.limits.timeout_ms == 5_000
    assert d.limit_layers["timeout_ms"] == "request"
    assert d.limits.memory_bytes == 1024**3
    assert d.limit_layers["memory_bytes"] == "grant"
    plain = Guard(ps).decide(profile, ProcExecOp(tool="make"), now_ms=0)
    assert plain.limits is not None
    assert plain.limit_layers is not None
    assert plain.limits.timeout_ms == 120_000
    assert plain.limit_layers["timeout_ms"] == "manifest"


def test_widening_settings_or_override_is_refused_naming_the_field(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, RULES)
    manifest, grant = tool()
    builder = ProfileBuilder(ps)
    with pytest.raises(PolicyEngineError, match=r"settings would widen `limits.max_depth`"):
        builder.build(grant, manifest, settings=Settings(limits=Limits(max_depth=6)))
    with pytest.raises(PolicyEngineError, match=r"override would widen `limits.max_depth`"):
        builder.build(grant, manifest, overrides=Overrides(limits=Limits(max_depth=6)))
    narrowed = builder.build(grant, manifest, overrides=Overrides(limits=Limits(max_depth=2)))
    assert narrowed.limit_layers["max_depth"] == "override"


def test_explain_names_the_layer_and_does_not_blame_a_rule_without_limits(
        tmp_path: Path) -> None:
    ps = compile_text(tmp_path, BIG)
    manifest, grant = tool()
    too_deep = ExplainRequest.model_validate({"op": FsListOp(path="/w", depth=30), "now_ms": 0})
    exp = explain(ps, manifest, grant, too_deep)
    assert not exp.decision.allowed
    assert exp.decision.rule is None  # `ls` has no limits of its own
    assert "(set by policy default)" in exp.decision.reason
    text = render_text(exp)
    assert "edit the rule" not in text
    assert "policy default layer" in text
    ok = explain(ps, manifest, grant,
                 ExplainRequest.model_validate({"op": FsListOp(path="/w", depth=20), "now_ms": 0}))
    data = ok.to_json()
    assert data["limits"]["max_depth"] == {"value": 20, "layer": "policy default"}
    assert data["limits"]["timeout_ms"] == {"value": 300_000, "layer": "policy default"}
    assert data["limits"]["max_files"] == {"value": 100, "layer": "built-in"}
    assert "timeout_ms             300000 ms  (policy default)" in render_text(ok)


def test_explain_cli_shows_rule_limits_by_rule_id(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    req = tmp_path / "r.json"
    req.write_text('{"op": {"kind": "proc.exec", "tool": "git", "args": ["status"]}}')
    done = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "explain", "--policy",
         str(root / "policies" / "org.sbpolicy"), "--manifest",
         str(root / "manifests" / "shell.json"), "--grant",
         str(root / "grants" / "shell-agent.json"), "--request", str(req)],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "memory_bytes           536870912 bytes  (rule git-readonly)" in done.stdout
    assert "max_stdout_bytes       262144 bytes  (manifest)" in done.stdout


def test_the_disk_write_quota_is_a_limit_the_guard_decides(tmp_path: Path) -> None:
    """`disk_write` (issue 32 item 2): a language limit, a built-in default, and a rule's
    value on the decision with its layer, as every other limit."""
    ps = compile_text(tmp_path, 'defaults { network off }\n'
                      'permit "small" proc.exec tool "make" limits { disk_write 8MiB }\n')
    manifest, grant = tool()
    profile = ProfileBuilder(ps).build(grant, manifest)
    assert profile.limits.disk_write_bytes == SYSTEM_DEFAULT_LIMITS.disk_write_bytes
    assert profile.limit_layers["disk_write_bytes"] == "built-in"
    d = Guard(ps).decide(profile, ProcExecOp(tool="make"), now_ms=0)
    assert d.allowed, d.reason
    assert d.limits is not None
    assert d.limit_layers is not None
    assert d.limits.disk_write_bytes == 8 * 1024**2
    assert d.limit_layers["disk_write_bytes"] == "rule"
