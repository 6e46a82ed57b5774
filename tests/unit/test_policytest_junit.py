"""JUnit XML: parsed back with xml.etree, counts, failure text and file/line attributes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from policy_engine.policytest import run_tests
from policy_engine.policytest.junit import classname, write_junit

DATA = Path(__file__).resolve().parents[1] / "data" / "policytest"


def test_junit_has_a_suite_per_file_a_case_per_case_and_failure_details(tmp_path: Path) -> None:
    failing = str(DATA / "failing" / "failing.sbtest.yaml")
    passing = str(DATA / "small" / "small.sbtest.yaml")
    broken = str(DATA / "malformed" / "duplicate-names.sbtest.yaml")
    run = run_tests([failing, passing, broken], jobs=1)
    out = tmp_path / "junit.xml"
    write_junit(run, str(out))
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("9", "2", "1")
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [failing, passing, broken]
    assert [s.get("tests") for s in suites] == ["4", "4", "1"]
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == [
        "git status", "push is expected to pass but is blocked", "read blamed on the wrong rule",
        "curl"]
    assert {c.get("classname") for c in cases} == {classname(failing)}
    assert [c.get("line") for c in cases] == ["7", "10", "14", "18"]
    assert all(c.get("file") == failing for c in cases)
    assert all(float(c.get("time") or "x") >= 0 for c in cases)
    failure = cases[1].find("failure")
    assert failure is not None
    assert failure.get("message") == ("decision: expected allow, got deny; "
                                      "rule: expected git-status, got no-push")
    assert failure.text is not None
    assert "forbid        match           no-push" in failure.text
    assert cases[0].find("failure") is None
    error = suites[2].find("testcase/error")
    assert error is not None
    assert (error.get("message") or "").startswith("SBP401 ")
    assert "duplicate-names.sbtest.yaml:8:5" in (error.text or "")


def test_classname_drops_the_suffix_and_uses_dots() -> None:
    assert classname("examples/policies/org.sbtest.yaml") == "examples.policies.org"
    assert classname("./a/b.sbtest.json") == "a.b"


def test_names_with_characters_xml_forbids_still_give_parseable_junit(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from policy_engine.cli.main import cli

    examples = Path(__file__).resolve().parents[2] / "examples"
    test_file = tmp_path / "esc.sbtest.yaml"
    test_file.write_text(
        f"policy: {examples / 'policies' / 'org.sbpolicy'}\n"
        f"manifest: {examples / 'manifests' / 'shell.json'}\n"
        f"grant: {examples / 'grants' / 'shell-agent.json'}\n"
        "now_ms: 1795000000000\ncases:\n"
        '  - name: "git status \\e[31m red \\x00 nul \\x7f del"\n'
        "    op: {kind: proc.exec, tool: git, args: [status]}\n"
        "    want_decision: deny\n", encoding="utf-8")   # fails: the failure text is written too
    out = tmp_path / "junit.xml"
    result = CliRunner().invoke(cli, ["test", "--junit", str(out), str(test_file)])
    assert result.exit_code == 1, result.output
    root = ET.parse(out).getroot()   # raised "not well-formed (invalid token)" before
    case = root.find(".//testcase")
    assert case is not None
    assert case.get("name") == "git status \\x1b[31m red \\x00 nul \x7f del"
    failure = case.find("failure")
    assert failure is not None
    assert "decision: expected deny, got allow" in (failure.get("message") or "")
    assert "\\x1b" in (failure.text or "")
