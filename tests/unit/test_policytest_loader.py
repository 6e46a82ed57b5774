"""Test files: loading, validation diagnostics (line:col, IDs) and discovery."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from policy_engine.errors import DiagnosticsError
from policy_engine.policytest import discover, load_test_file

DATA = Path(__file__).resolve().parents[1] / "data" / "policytest"
MALFORMED = DATA / "malformed"


def diags_of(path: Path) -> list[tuple[str, int, int, str]]:
    with pytest.raises(DiagnosticsError) as info:
        load_test_file(str(path))
    return [(d.id, d.span.line if d.span else 0, d.span.column if d.span else 0, d.message)
            for d in info.value.diagnostics]


def test_loads_cases_with_their_lines_and_resolved_fixtures() -> None:
    tf = load_test_file(str(DATA / "small" / "small.sbtest.yaml"))
    assert [c.spec.name for c in tf.cases] == [
        "reads a source file", "git status", "git push is blocked", "curl is not granted"]
    assert [c.span.line for c in tf.cases] == [6, 10, 14, 19]
    assert tf.policy_key == (os.path.realpath(DATA / "small" / "small.sbpolicy"),)
    assert Path(tf.cases[0].manifest).resolve() == (DATA / "fixtures" / "shell.json").resolve()
    assert tf.cases[0].now_ms == 1795000000000
    # written as `want_rule: null`: checked (and must be none); not written: not checked
    assert tf.cases[3].spec.checks_rule
    assert tf.cases[3].spec.want_rule is None
    assert not tf.cases[0].spec.checks_code


@pytest.mark.parametrize(("name", "expected"), [
    ("bad-yaml", [("SBP105", 5, 18, "invalid YAML")]),
    ("unknown-field", [("SBP105", 5, 5, "`cases[0].want_decision`: field required"),
                       ("SBP105", 7, 5, "`cases[0].want_decison`: extra inputs")]),
    ("missing-want", [("SBP105", 5, 5, "`cases[0].want_decision`: field required")]),
    ("bad-op-kind", [("SBP105", 6, 5, "input tag 'proc.exe'")]),
    ("missing-policy", [("SBP402", 1, 1, "policy file `../small/nope.sbpolicy` not found")]),
    ("duplicate-names", [("SBP401", 8, 5, "already used by the case at line 5")]),
    ("bad-expectations", [("SBP404", 8, 5, "`POLICY.DENIED` is not an error code"),
                          ("SBP405", 13, 5, "an allow carries no code"),
                          ("SBP403", 14, 5, "has no grant")]),
])
def test_malformed_test_files_give_positioned_diagnostics(
    name: str, expected: list[tuple[str, int, int, str]],
) -> None:
    got = diags_of(MALFORMED / f"{name}.sbtest.yaml")
    assert [(i, line, col) for i, line, col, _ in got] == [(i, ln, c) for i, ln, c, _ in expected]
    for (_, _, _, message), (_, _, _, fragment) in zip(got, expected, strict=True):
        assert fragment in message


def test_format_errors_point_to_the_test_file_docs() -> None:
    with pytest.raises(DiagnosticsError) as info:
        load_test_file(str(MALFORMED / "bad-yaml.sbtest.yaml"))
    assert info.value.diagnostics[0].help is not None
    assert "docs/policy-tests.md" in info.value.diagnostics[0].help


def test_json_test_files_load_with_positions(tmp_path: Path) -> None:
    shutil.copytree(DATA / "fixtures", tmp_path / "fixtures")
    shutil.copy(DATA / "small" / "small.sbpolicy", tmp_path / "p.sbpolicy")
    path = tmp_path / "p.sbtest.json"
    path.write_text('{\n  "policy": "p.sbpolicy",\n  "manifest": "fixtures/shell.json",\n'
                    '  "grant": "fixtures/shell-agent.json",\n  "cases": [\n'
                    '    {"name": "a", "op": {"kind": "tmp.alloc", "size_bytes": 1},\n'
                    '     "want_decision": "maybe"}\n  ]\n}\n')
    got = diags_of(path)
    assert got[0][:3] == ("SBP105", 7, 6)
    assert "want_decision" in got[0][3]


def test_discovery_walks_directories_and_skips_hidden_ones(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    for rel in ("a/x.sbtest.yaml", "a/b/y.sbtest.yml", "a/b/z.sbtest.json", ".git/h.sbtest.yaml",
                "a/not-a-test.yaml"):
        (tmp_path / rel).write_text("{}")
    found = discover((str(tmp_path),))
    assert [Path(f).relative_to(tmp_path).as_posix() for f in found.files] == [
        "a/x.sbtest.yaml", "a/b/y.sbtest.yml", "a/b/z.sbtest.json"]
    assert not found.diagnostics


def test_discovery_reports_missing_paths_and_selects_test_files_by_policy() -> None:
    found = discover((str(DATA / "nope"), str(DATA / "small" / "small.sbpolicy")))
    assert [d.id for d in found.diagnostics] == ["SBP406"]
    # both test files mentioning small.sbpolicy are candidates; each runs only if it names it
    names = sorted(Path(f).name for f in found.files)
    assert "small.sbtest.yaml" in names
    assert all(f in found.needs_policy for f in found.files)
