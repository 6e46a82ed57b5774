"""Suppressions for JSON/YAML documents (`.sbpolicy-ignore.yaml` beside them), and every file
under examples/ passing `lint --deny-warnings` with them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
GRANT = {"tenant": "acme", "subject_id": "a", "tool_name": "t", "call_id": "c-1",
         "expires_at": 4102444800000,
         "capabilities": [{"kind": "proc.exec", "tool": "git"},
                          {"kind": "proc.exec", "tool": "ls"}]}


def lint(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["lint", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exc_info
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def _grant(tmp_path: Path, ignore: str | None) -> str:
    (tmp_path / "g.json").write_text(json.dumps(GRANT, indent=1))
    if ignore is not None:
        (tmp_path / ".sbpolicy-ignore.yaml").write_text(ignore)
    return str(tmp_path / "g.json")


def test_every_file_under_examples_passes_lint_deny_warnings() -> None:
    code, out = lint("--deny-warnings", str(ROOT / "examples"))
    assert code == 0, out
    assert " 0 error(s), 0 warning(s)" in out
    # the broad example grants and manifests are there, suppressed with their reasons
    summary = out.strip().splitlines()[-1]
    assert int(summary.split(", ")[-1].split()[0]) >= 16, summary


def test_a_document_without_suppressions_fails_deny_warnings(tmp_path: Path) -> None:
    code, out = lint("--deny-warnings", _grant(tmp_path, None))
    assert code == 1
    assert out.count("SBP312") == 2


def test_a_reasoned_entry_suppresses_only_the_capability_it_names(tmp_path: Path) -> None:
    path = _grant(tmp_path, '- file: g.json\n  at: capabilities[0]\n  ignore: [SBP312]\n'
                            '  reason: "policy templates decide git"\n')
    code, out = lint("--deny-warnings", path)
    assert code == 1  # capabilities[1] (ls) is still reported
    assert "capabilities[1] of grant" in out
    assert "capabilities[0] of grant" not in out
    assert "1 suppressed" in out
    (tmp_path / ".sbpolicy-ignore.yaml").write_text(
        '- file: g.json\n  ignore: SBP312\n  reason: "the policy decides both"\n')
    code, out = lint("--deny-warnings", path)
    assert code == 0, out
    assert "2 suppressed" in out


def test_an_entry_without_a_reason_is_reported_and_not_honoured(tmp_path: Path) -> None:
    path = _grant(tmp_path, "- file: g.json\n  ignore: [SBP312]\n")
    code, out = lint(path)
    assert code == 0  # warnings only
    assert ".sbpolicy-ignore.yaml:1:3: SBP346" in out
    assert out.count("SBP312 capabilities") == 2
    assert lint("--deny-warnings", path)[0] == 1


def test_unknown_unused_and_malformed_entries_are_findings(tmp_path: Path) -> None:
    path = _grant(tmp_path, (
        '- file: g.json\n  ignore: [SBP312, SBP999, SBP347]\n  reason: "x"\n'
        '- file: g.json\n  at: capabilities[5]\n  ignore: [SBP301]\n  reason: "y"\n'
        '- just a string\n'
        '- {file: g.json, ignore: [SBP312], reason: "z", extra: 1}\n'))
    code, out = lint("--deny-warnings", path)
    assert code == 1
    assert "SBP348 `SBP999` in suppression: not a lint rule ID" in out
    assert "SBP348 `SBP347` in suppression: suppression findings cannot be suppressed" in out
    assert ":4:3: SBP347 suppression of `SBP301` in `g.json` at capabilities[5]" in out
    assert ":8:3: SBP345" in out
    assert ":9:3: SBP345" in out
    assert "2 suppressed" in out  # the first entry still works


def test_an_unreadable_suppression_file_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    path = _grant(tmp_path, "- file: [unclosed\n")
    code, out = lint(path)
    assert "SBP345 cannot read" in out
    assert code == 0  # a warning: the document's own findings are still reported
    assert out.count("SBP312 capabilities") == 2
    (tmp_path / ".sbpolicy-ignore.yaml").write_text("file: g.json\n")
    assert "must be a list" in lint(path)[1]


def test_entries_for_documents_not_linted_are_not_unused(tmp_path: Path) -> None:
    path = _grant(tmp_path, '- file: other.json\n  ignore: [SBP312]\n  reason: "r"\n')
    code, out = lint(path)
    assert "SBP347" not in out
    assert code == 0
