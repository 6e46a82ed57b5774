"""Facts have a source (issue 26): declared and unknown fact sources, policy before facts, an
unreadable fact is a deny, and ``policy-engine test`` never reads the machine's disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.errors import DiagnosticsError
from policy_engine.explain import ExplainRequest, explain
from policy_engine.guard import Guard
from policy_engine.guard.facts import UNKNOWN_FACTS, parse_declared
from policy_engine.guard.fsfacts import fs_refusal
from policy_engine.model import FsReadOp
from policy_engine.policytest import run_tests
from policy_engine.policytest.loader import load_test_file

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples"
DATA = REPO / "tests" / "data" / "policytest" / "facts"
NOW = 1795000000000


@pytest.fixture(scope="module")
def org() -> tuple[object, object, object]:
    ps = compile_files([str(EX / "policies" / "org.sbpolicy")])
    return (ps, load_manifest(str(EX / "manifests" / "shell.json")),
            load_grant(str(EX / "grants" / "shell-agent.json")))


def _explain(org: tuple[object, object, object], op: object, guard: Guard | None = None,
             facts: dict[str, object] | None = None) -> object:
    ps, manifest, grant = org
    req = ExplainRequest.model_validate({"op": op, "now_ms": NOW, "facts": facts})
    return explain(ps, manifest, grant, req, guard=guard)  # type: ignore[arg-type]


def test_a_forbidden_call_is_reported_by_its_rule_whatever_its_cwd(
        org: tuple[object, object, object]) -> None:
    """Policy before facts: `git push --force` with a cwd outside root_fs and with one that
    does not exist is refused by `no-force-push`, not by the cwd (docs/cli.md)."""
    for cwd in ("/etc", "/workspace/does-not-exist", "/nowhere/at/all"):
        op = {"kind": "proc.exec", "tool": "git", "args": ["push", "--force"], "cwd": cwd}
        for guard in (None, Guard(org[0]).with_facts(  # type: ignore[arg-type]
                parse_declared({cwd: "absent"}))):
            d = _explain(org, op, guard).decision  # type: ignore[attr-defined]
            assert (d.decision, d.code) == ("deny", "SANDBOX.CAPABILITY_BLOCKED"), cwd
            assert d.rule is not None, (cwd, d.reason)
            assert d.rule.id == "no-force-push", (cwd, d.reason)
    # the same cwd on a permitted call is refused for the cwd, after the policy passed
    d = _explain(org, {"kind": "proc.exec", "tool": "git", "args": ["status"],
                       "cwd": "/workspace/gone"},
                 facts={"/workspace/gone": "absent"}).decision  # type: ignore[attr-defined]
    assert d.rule is None
    assert "does not exist (declared)" in d.reason
    nodes = [s.node for s in d.trace]
    assert nodes.index("fact") > nodes.index("consent") > nodes.index("permit")


def test_without_an_executor_the_cwd_existence_is_left_to_its_view(
        org: tuple[object, object, object]) -> None:
    """The guard alone does not judge a cwd on this host's disk: the trace says whose view
    decides it (the backend step of `explain --config` and the run)."""
    d = _explain(org, {"kind": "proc.exec", "tool": "git", "args": ["status"],
                       "cwd": "/workspace/absent-here"}).decision  # type: ignore[attr-defined]
    assert d.decision == "allow"
    fact = [s for s in d.trace if s.node == "fact"]
    assert fact
    assert "executor's view" in fact[0].detail


def test_declared_facts_decide_a_dry_run_without_config(
        org: tuple[object, object, object]) -> None:
    op = {"kind": "fs.read", "path": "/workspace/src/app.py"}
    assert _explain(org, op).decision.decision == "allow"  # type: ignore[attr-defined]
    d = _explain(org, op, facts={"/workspace/src/app.py": "dir"}).decision  # type: ignore[attr-defined]
    assert (d.decision, d.code) == ("deny", "SANDBOX.CAPABILITY_BLOCKED")
    assert "not a regular file" in d.reason
    assert any(s.node == "fact" and "(declared)" in (s.detail or "") for s in d.trace)


def test_an_unreadable_fact_is_a_deny_never_an_allow(org: tuple[object, object, object],
                                                      tmp_path: Path) -> None:
    d = _explain(org, {"kind": "fs.read", "path": "/workspace/k"},
                 facts={"/workspace/k": "unreadable"}).decision  # type: ignore[attr-defined]
    assert d.decision == "deny"
    assert "cannot be read" in d.reason
    # on the host: an lstat that fails for another reason than absence refuses (it was an
    # allow: "the executor's open answers it")
    long = str(tmp_path / ("n" * 300))
    found = fs_refusal("fs.read", FsReadOp(path=long), long, None, None)
    assert found is not None
    assert "cannot be read" in found[1]
    assert fs_refusal("fs.read", FsReadOp(path=str(tmp_path / "no")), str(tmp_path / "no"),
                      None, None) is None  # absent: the run answers it


def test_unknown_facts_never_touch_the_disk(tmp_path: Path, org: tuple[object, object, object],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard on unknown facts decides the same whatever this machine holds: no lstat, no
    probe, no realpath (each would raise here)."""
    guard = Guard(org[0]).with_facts(UNKNOWN_FACTS)  # type: ignore[arg-type]
    ops = [{"kind": "fs.read", "path": "/workspace/src/app.py"},
           {"kind": "fs.write", "path": "/workspace/work/n.md", "bytes_b64": "eAo="},
           {"kind": "proc.exec", "tool": "git", "args": ["status"], "cwd": "/workspace/w"}]
    before = [_explain(org, op, guard).decision for op in ops]  # type: ignore[attr-defined]

    def no_disk(*_: object, **__: object) -> object:
        raise AssertionError("the disk was read")

    for name in ("lstat", "stat", "readlink", "scandir"):
        monkeypatch.setattr(os, name, no_disk)
    monkeypatch.setattr("policy_engine.guard.resolve.probe", no_disk)
    after = [_explain(org, op, guard).decision for op in ops]  # type: ignore[attr-defined]
    assert [(d.decision, d.code, d.rule) for d in before] == \
        [(d.decision, d.code, d.rule) for d in after]


def test_the_facts_test_file_passes_and_names_its_sources() -> None:
    run = run_tests([str(DATA / "facts.sbtest.yaml")], jobs=1)
    assert (run.count("passed"), run.count("failed"), run.count("error")) == (10, 0, 0), \
        [(c.name, c.status, c.reason) for f in run.files for c in f.cases if c.status != "passed"]


@pytest.mark.parametrize(("facts", "message"), [
    ({"relative/path": "dir"}, "relative path"),
    ({"/w/x": "socket"}, "`kind` must be one of"),
    ({"/w/x": {"kind": "file", "size": -1}}, "`size`"),
    ({"/w/x": {"kind": "dir", "target": "/etc"}}, "only a symlink has a `target`"),
    ({"/w/x": {"kind": "file", "mode": 7}}, "unknown keys"),
])
def test_malformed_facts_are_located_diagnostics(tmp_path: Path, facts: dict[str, object],
                                                 message: str) -> None:
    import json

    test = tmp_path / "t.sbtest.json"
    test.write_text(json.dumps({
        "policy": str(EX / "policies" / "org.sbpolicy"),
        "manifest": str(EX / "manifests" / "shell.json"),
        "grant": str(EX / "grants" / "shell-agent.json"), "facts": facts,
        "cases": [{"name": "c", "op": {"kind": "fs.read", "path": "/workspace/a"},
                   "want_decision": "allow"}]}))
    with pytest.raises(DiagnosticsError) as info:
        load_test_file(str(test))
    d = info.value.diagnostics[0]
    assert d.id == "SBP411"
    assert message in d.message
    assert d.span.line >= 1


def test_a_missing_fixture_directory_is_a_diagnostic(tmp_path: Path) -> None:
    test = tmp_path / "t.sbtest.yaml"
    test.write_text(f"policy: {EX / 'policies' / 'org.sbpolicy'}\n"
                    f"manifest: {EX / 'manifests' / 'shell.json'}\n"
                    f"grant: {EX / 'grants' / 'shell-agent.json'}\n"
                    "fixture: not-here\n"
                    "cases:\n- {name: c, op: {kind: fs.read, path: /workspace/a}, "
                    "want_decision: allow}\n")
    with pytest.raises(DiagnosticsError) as info:
        load_test_file(str(test))
    assert [d.id for d in info.value.diagnostics] == ["SBP411"]
    assert info.value.diagnostics[0].span.line == 4


def test_declared_links_loop_is_refused() -> None:
    src = parse_declared({"/w/a": {"kind": "symlink", "target": "/w/b"},
                          "/w/b": {"kind": "symlink", "target": "/w/a"}})
    with pytest.raises(Exception, match="too many symlinks"):
        src.resolve("/w", "/tmp", "/w/a/x")
