"""The policy path variable ``$SESSION``: a permit's paths may start with it, the profile builder
resolves it from the engine's own settings (the session runtime's ``Settings.session``) per call,
outside a session it matches nothing, and every cache level keys on the resolved value.

Before: ``$SESSION/**`` was SBP206 (not absolute), so a sessions policy had to spell the host
workspace root, and every session's grant was the only thing keeping it to its own directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.errors import DiagnosticsError
from policy_engine.explain.pipeline import explain
from policy_engine.explain.request import ExplainRequest
from policy_engine.fmt import format_ast
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.lint.engine import lint_text
from policy_engine.lsp import analysis
from policy_engine.model import FsReadOp, FsWriteOp, Grant, Manifest, Settings
from policy_engine.patterns.paths import resolve_variables, validate_glob, validate_policy_glob
from policy_engine.profile import ProfileBuilder

POLICY = """policy "vars" version "1.0.0"
defaults { timeout 30s  network off }
permit "py" proc.exec tool "python3"
permit "own" fs.read, fs.write  paths ["$SESSION/**"]
permit "shared" fs.read  paths ["/srv/shared/**"]
require consent when `profile.safety == "High"`
"""
WS = "/srv/ws/sessions"
A, B = f"{WS}/a/work", f"{WS}/b/work"


@pytest.fixture(scope="module")
def ps(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    path = tmp_path_factory.mktemp("vars") / "p.sbpolicy"
    path.write_text(POLICY)
    return compile_files([path], home="/root")


def _inputs(call_id: str = "c1") -> tuple[Grant, Manifest]:
    """A tool granted the whole workspace root: only the policy's `$SESSION` narrows it."""
    caps = [{"kind": "fs.read", "paths": [f"{WS}/**", "/srv/shared/**"]},
            {"kind": "fs.write", "paths": [f"{WS}/**"]}]
    manifest = Manifest.model_validate({
        "name": "t", "version": "1.0.0", "permissions": caps, "side_effects": ["Write"],
        "safety_class": "Low"})
    grant = Grant.model_validate({
        "tenant": "acme", "subject_id": "agent:x", "tool_name": "t", "call_id": call_id,
        "expires_at": 4102444800000, "capabilities": caps})
    return grant, manifest


def _allowed(ps: PolicySet, settings: Settings | None, path: str, *, write: bool = False,
             builder: ProfileBuilder | None = None) -> bool:
    grant, manifest = _inputs()
    profile = (builder or ProfileBuilder(ps)).build(grant, manifest, settings=settings)
    op = FsWriteOp(path=path) if write else FsReadOp(path=path)
    return Guard(ps).decide(profile, op).decision == "allow"


@pytest.mark.parametrize(("pattern", "why"), [
    ("$SESSION/**", None), ("$SESSION", None), ("$SESSION/out/*.csv", None),
    ("$WORKSPACE/**", "unknown path variable `$WORKSPACE`"),
    ("$SESSIONS/**", "unknown path variable `$SESSIONS`"),
    ("$/x", "unknown path variable `$`"),
    ("$SESSION/../other", "contains a `..` segment"),
    ("$SESSION/a**", "`**` must be a whole segment in `$SESSION/a**`"),
    ("/data/$SESSION/**", None),  # a `$` further on is a file name's own character
])
def test_permit_paths_take_known_variables_only(pattern: str, why: str | None) -> None:
    got = validate_policy_glob(pattern)
    assert (got is None) if why is None else (got is not None and why in got), got


def test_a_variable_is_never_a_glob_of_its_own() -> None:
    """Guard and sandbox matchers refuse an unresolved variable (a permit: nothing; a forbid:
    everything), so a `$SESSION` that ever reached them unresolved would fail closed."""
    assert validate_glob("$SESSION/**") is not None
    assert resolve_variables("$SESSION/**", {"$SESSION": None}) is None
    assert resolve_variables("$SESSION/**", {"$SESSION": "relative/dir"}) is None
    assert resolve_variables("$SESSION/**", {"$SESSION": A + "/"}) == f"{A}/**"
    assert resolve_variables("$SESSION", {"$SESSION": A}) == A
    for unusable in ("/", "//", "/srv/ws*/a/work", "/srv/ws/a?/work"):
        assert resolve_variables("$SESSION/**", {"$SESSION": unusable}) is None, unusable


@pytest.mark.parametrize("session", ["/", "/srv/ws/sessions/*"])
def test_a_session_directory_no_glob_names_exactly_grants_nothing(ps: PolicySet,
                                                                  session: str) -> None:
    """A workspace under `/srv/ws*` would make `$SESSION/**` a wildcard over its neighbours
    (globs have no escape), and `/` would be everything: both match nothing, and say so."""
    assert not _allowed(ps, Settings(session=session), f"{A}/x")
    assert not _allowed(ps, Settings(session=session), "/etc/hostname")
    grant, manifest = _inputs()
    said = explain(ps, manifest, grant, ExplainRequest(op=FsReadOp(path=f"{A}/x"),
                                                       settings=Settings(session=session)))
    notes = [s for s in said.decision.trace or () if s.node == "variables"]
    assert [n.outcome for n in notes] == ["skip"], notes
    assert "no glob names exactly" in notes[0].detail


@pytest.mark.parametrize(("line", "message"), [
    ('forbid "f" fs.write paths ["$SESSION/.git/**"]', "may only start a permit rule's paths"),
    ('profile "p" { writable ["$SESSION/**"] }', "may only start a permit rule's paths"),
    ('permit "w" fs.read paths ["$WORKSPACE/**"]', "unknown path variable `$WORKSPACE`"),
])
def test_misplaced_or_unknown_variables_are_located_errors(tmp_path: Path, line: str,
                                                           message: str) -> None:
    path = tmp_path / "bad.sbpolicy"
    path.write_text('policy "bad" version "1.0.0"\n' + line + "\n")
    with pytest.raises(DiagnosticsError) as caught:
        compile_files([path])
    [diag] = caught.value.diagnostics
    assert diag.id == "SBP206", diag
    assert message in diag.message, diag
    assert diag.span is not None
    assert diag.span.line == 2
    assert line[diag.span.column - 1] == '"'  # at the path's own string


def test_outside_a_session_the_variable_matches_nothing(ps: PolicySet) -> None:
    assert not _allowed(ps, None, f"{A}/x")
    assert not _allowed(ps, Settings(root_fs=WS), f"{A}/x")  # a root is no session
    assert _allowed(ps, None, "/srv/shared/x")  # the policy's fixed paths still apply


def test_a_session_reaches_its_own_directory_only(ps: PolicySet) -> None:
    own = Settings(root_fs=f"{WS}/a", session=A)
    assert _allowed(ps, own, f"{A}/data/in.csv")
    assert _allowed(ps, own, f"{A}/out.txt", write=True)
    assert _allowed(ps, own, A)
    for other in (f"{B}/secret", f"{WS}/a/state", f"{A}-evil/x", f"{A}/../../b/work/secret"):
        assert not _allowed(ps, own, other), other
        assert not _allowed(ps, own, other, write=True), other


def test_every_cache_level_keys_on_the_resolved_value(ps: PolicySet) -> None:
    """One builder, sessions a and b alternating, with the same grant object (identity
    level), an equal grant in another object (call level) and another call id (shape level):
    each call gets its own session's path, never the other's."""
    builder = ProfileBuilder(ps)
    grant, manifest = _inputs()
    hashes = {}
    for round_ in range(3):
        for sid, work in (("a", A), ("b", B)):
            settings = Settings(root_fs=f"{WS}/{sid}", session=work)
            same, _ = _inputs()
            other_call, _ = _inputs(f"c-{round_}")
            for g in (grant, same, other_call):
                profile = builder.build(g, manifest, settings=settings)
                paths = {p for c in profile.capabilities for a in c.all_of
                         for p in getattr(a, "paths", ())}
                other = f"{WS}/{'b' if sid == 'a' else 'a'}/"
                assert f"{work}/**" in paths, paths
                assert not any(p.startswith(other) for p in paths), paths
                fresh = ProfileBuilder(ps).build_uncached(g, manifest, settings=settings)
                assert profile.profile_hash == fresh.profile_hash  # the cache's is the meet's
                if g is grant:
                    hashes.setdefault(sid, profile.profile_hash)
                    assert hashes[sid] == profile.profile_hash
    assert hashes["a"] != hashes["b"]


def test_explain_shows_the_resolved_path_and_decides_as_the_run(ps: PolicySet) -> None:
    grant, manifest = _inputs()
    builder, guard = ProfileBuilder(ps), Guard(ps)
    for settings, path, allowed, step in (
            (Settings(session=A), f"{A}/x", True, f"`$SESSION/**` → `{A}/**`"),
            (Settings(session=A), f"{B}/x", False, f"`$SESSION/**` → `{A}/**`"),
            (None, f"{A}/x", False, "matches nothing: this call is not in a session")):
        said = explain(ps, manifest, grant, ExplainRequest(op=FsReadOp(path=path),
                                                           settings=settings)).decision
        run = guard.decide(builder.build(grant, manifest, settings=settings),
                           FsReadOp(path=path))
        assert (said.decision, said.code, said.reason) == (run.decision, run.code, run.reason)
        assert said.allowed is allowed
        notes = [s for s in said.trace or () if s.node == "variables"]
        assert len(notes) == 1, notes
        assert step in notes[0].detail, notes
        assert notes[0].rule is not None
        assert notes[0].rule.id.endswith("own")


def test_lint_fmt_and_the_language_server_know_the_variable(tmp_path: Path) -> None:
    path = str(tmp_path / "p.sbpolicy")
    # only the interpreter's own warning (line 3): nothing about `$SESSION/**` (line 4)
    assert [(f.diagnostic.id, f.anchor_line) for f in lint_text(POLICY, path)] == [
        ("SBP311", 3)]
    formatted = format_ast(analysis.parsed(POLICY, path))
    assert 'paths ["$SESSION/**"]' in formatted
    assert format_ast(analysis.parsed(formatted, path)) == formatted
    assert [d.id for d in analysis.diagnostics(POLICY, path)] == ["SBP311"]
    broken = POLICY.replace("$SESSION/**", "$SESION/**")
    [diag] = [d for d in analysis.diagnostics(broken, path) if d.id != "SBP311"]
    assert diag.id == "SBP206"
    assert "`$SESION`" in diag.message
    assert diag.span is not None
    assert (diag.span.line, diag.span.column) == (4, 40)
    pf = analysis.parsed(POLICY, path)
    hovered = analysis.hover(pf, 4, 40)
    assert hovered is not None
    assert "$SESSION/**" in hovered[0]


@pytest.mark.parametrize("where", ["request", "settings"])
def test_a_document_cannot_name_the_session(tmp_path: Path, where: str) -> None:
    """`policy-engine run`/`explain` read the caller's files: `settings.session` there would
    let a caller choose the directory `$SESSION` grants. A located error, no traceback."""
    (tmp_path / "p.sbpolicy").write_text(POLICY)
    grant, manifest = _inputs()
    (tmp_path / "m.json").write_text(manifest.model_dump_json())
    (tmp_path / "g.json").write_text(grant.model_dump_json())
    settings = {"root_fs": WS, "session": A}
    if where == "request":
        doc = {"op": {"kind": "fs.read", "path": f"{A}/x"}, "settings": settings}
    else:
        doc = settings
    (tmp_path / "doc.json").write_text(json.dumps(doc, indent=1))
    args = (["explain", "--policy", str(tmp_path / "p.sbpolicy"), "--manifest",
             str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"), "--request",
             str(tmp_path / "doc.json")] if where == "request" else
            ["check", str(tmp_path / "doc.json")])
    out = subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                         capture_output=True, text=True, check=False)
    said = out.stdout + out.stderr
    assert out.returncode != 0, said
    assert "Traceback" not in said
    assert "`session` is set by the engine's session runtime" in said, said
    assert "doc.json:" in said, said


def test_a_document_with_the_default_null_session_is_read(tmp_path: Path) -> None:
    """A serialized Settings (`model_dump`) carries `"session": null`: that names no directory
    and is read as the default (the evidence-marker test's request files failed with SBP105)."""
    (tmp_path / "p.sbpolicy").write_text(POLICY)
    grant, manifest = _inputs()
    (tmp_path / "m.json").write_text(manifest.model_dump_json())
    (tmp_path / "g.json").write_text(grant.model_dump_json())
    doc = {"op": {"kind": "fs.read", "path": f"{A}/x"},
           "settings": {"root_fs": WS, "session": None}}
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-m", "policy_engine.cli", "explain", "--policy",
                          str(tmp_path / "p.sbpolicy"), "--manifest", str(tmp_path / "m.json"),
                          "--grant", str(tmp_path / "g.json"), "--request",
                          str(tmp_path / "doc.json")], capture_output=True, text=True,
                         check=False)
    said = out.stdout + out.stderr
    assert "SBP105" not in said, said
    assert "Traceback" not in said
    assert "matches nothing" in said or "deny" in said.lower(), said


def test_policy_tests_can_run_a_case_in_a_session(tmp_path: Path) -> None:
    """A policy test asserts what the policy does, so its cases may name the session (the one
    document that can): in it `$SESSION/**` allows the own directory, outside it nothing."""
    (tmp_path / "p.sbpolicy").write_text(POLICY)
    grant, manifest = _inputs()
    (tmp_path / "m.json").write_text(manifest.model_dump_json())
    (tmp_path / "g.json").write_text(grant.model_dump_json())
    cases = [
        {"name": "own", "op": {"kind": "fs.read", "path": f"{A}/x"},
         "settings": {"session": A}, "want_decision": "allow", "want_rule": "own"},
        {"name": "other", "op": {"kind": "fs.read", "path": f"{B}/x"},
         "settings": {"session": A}, "want_decision": "deny"},
        {"name": "no session", "op": {"kind": "fs.read", "path": f"{A}/x"},
         "want_decision": "deny", "want_rule": None},
    ]
    (tmp_path / "p.sbtest.json").write_text(json.dumps({
        "policy": "p.sbpolicy", "manifest": "m.json", "grant": "g.json",
        "now_ms": 1795000000000, "cases": cases}))
    out = subprocess.run([sys.executable, "-m", "policy_engine.cli", "test", str(tmp_path)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout, out.stdout
