"""Lint output formats: SARIF validated against the 2.1.0 schema, GitHub annotations parsed
back, the JSON document's shape, and the text renderer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from policy_engine.lint import CATALOGUE, LintResult, lint_paths
from policy_engine.lint.output.github import escape_data, escape_property, render_github
from policy_engine.lint.output.json_out import render_json
from policy_engine.lint.output.sarif import SRCROOT, render_sarif
from policy_engine.lint.output.text import render_text

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "sarif-schema-2.1.0.json"
POLICY = '''policy "t/p" version "1"
defaults { timeout 60s }
# sbpolicy: ignore SBP301 reason="crawler, 100% public"
permit "web" net.http hosts ["*"]
permit "mirror" net.http hosts ["mirror.example.com"] schemes ["http"]
permit "sh" proc.exec tool "bash" args ["-c", /.*/]
'''


@pytest.fixture
def result(tmp_path: Path) -> LintResult:
    (tmp_path / ".git").mkdir()
    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "a b.sbpolicy").write_text(POLICY)
    return lint_paths([str(tmp_path / "pol")], jobs=1)


def test_sarif_is_valid_and_complete(result: LintResult, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # help links go to the installed version's docs (docs_url.py); here: a docs site
    monkeypatch.setenv("POLICY_ENGINE_DOCS_URL", "https://docs.example.com/policy-engine/")
    doc = json.loads(render_sarif(result, root=tmp_path))
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules][:len(CATALOGUE)] == [r.id for r in CATALOGUE]
    for rule in rules[:len(CATALOGUE)]:
        assert rule["shortDescription"]["text"]
        assert rule["fullDescription"]["text"]
        assert rule["help"]["text"]
        assert rule["helpUri"] == ("https://docs.example.com/policy-engine/lint-rules.md#"
                                   + rule["id"].lower())
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
        assert "security" in rule["properties"]["tags"]
        assert 0.0 <= float(rule["properties"]["security-severity"]) <= 10.0
    by_id = {r["ruleId"]: r for r in run["results"]}
    assert set(by_id) == {"SBP301", "SBP320", "SBP310"}
    for res in run["results"]:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        loc = res["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"] == {"uri": "pol/a%20b.sbpolicy", "uriBaseId": SRCROOT}
        assert res["partialFingerprints"]
    region = by_id["SBP310"]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 6, "startColumn": 28, "endLine": 6, "endColumn": 34}
    assert by_id["SBP310"]["level"] == "error"
    assert by_id["SBP301"]["suppressions"] == [
        {"kind": "inSource", "status": "accepted", "justification": "crawler, 100% public"}]
    assert "suppressions" not in by_id["SBP320"]
    assert run["originalUriBaseIds"][SRCROOT]["uri"] == tmp_path.resolve().as_uri() + "/"


def test_sarif_for_unusable_input_is_valid(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sbpolicy"
    bad.write_text('policy "t" version "1"\npermit fs.read paths [\n')
    doc = json.loads(render_sarif(lint_paths([str(bad), str(tmp_path / "nope")], jobs=1),
                                  root=tmp_path))
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert {r["ruleId"] for r in doc["runs"][0]["results"]} == {"SBP103", "SBP100"}


_CMD = re.compile(r"^::(error|warning|notice) (?P<props>[^:]*)::(?P<msg>.*)$")


def _unescape(text: str) -> str:
    for a, b in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(a, b)
    return text


def test_github_annotations_parse_back(result: LintResult) -> None:
    lines = render_github(result).splitlines()
    parsed = []
    for line in lines:
        m = _CMD.match(line)
        assert m is not None, line
        props = dict(p.split("=", 1) for p in m.group("props").split(","))
        parsed.append((m.group(1), {k: _unescape(v) for k, v in props.items()},
                       _unescape(m.group("msg"))))
    assert [(lvl, p["title"], p["line"], p["col"]) for lvl, p, _ in parsed] == [
        ("warning", "SBP320", "5", "64"), ("error", "SBP310", "6", "28")]
    level, props, msg = parsed[1]
    assert props["file"].endswith("pol/a b.sbpolicy")
    assert props["endColumn"] == "34"
    assert msg.startswith("rule `sh` permits `bash`, a shell\n")


def test_github_escaping() -> None:
    assert escape_data("100%\r\nx:y,z") == "100%25%0D%0Ax:y,z"
    assert escape_property("a:b,c%") == "a%3Ab%2Cc%25"


def test_json_lists_suppressed_findings(result: LintResult) -> None:
    doc = json.loads(render_json(result))
    assert doc["version"] == 1
    assert doc["summary"] == {"error": 1, "warning": 1, "note": 0, "suppressed": 1}
    sup = [f for f in doc["findings"] if f["suppressed"]]
    assert [(f["id"], f["reason"], f["line"]) for f in sup] == [
        ("SBP301", "crawler, 100% public", 4)]
    assert {f["name"] for f in doc["findings"]} == {"any-host", "plain-http", "shell-tool"}
    assert all(len(f["fingerprint"]) == 32 for f in doc["findings"])


def test_text_shows_source_caret_and_hides_suppressed(result: LintResult) -> None:
    text = render_text(result)
    assert "SBP301" not in text
    assert 'a b.sbpolicy:6:28: SBP310 rule `sh` permits `bash`, a shell' in text
    assert '\npermit "sh" proc.exec tool "bash" args ["-c", /.*/]\n' + " " * 27 + "^^^^^^\n" in text
    assert text.rstrip().endswith("1 error(s), 1 warning(s), 0 note(s), 1 suppressed")


def test_fingerprint_survives_lines_moving(tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text(POLICY)
    before = {f.id: f.fingerprint(POLICY.split("\n")[f.span.line - 1])
              for f in lint_paths([str(p)], jobs=1).findings if f.span}
    moved = POLICY.replace("defaults", "\n\ndefaults")
    p.write_text(moved)
    after = {f.id: f.fingerprint(moved.split("\n")[f.span.line - 1])
             for f in lint_paths([str(p)], jobs=1).findings if f.span}
    assert before == after
