"""The runner: verdicts, expected vs actual, the trace of failures, coverage and the pool."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from policy_engine.policytest import discover, run_tests
from policy_engine.policytest.coverage import summarize, total_percent
from policy_engine.policytest.report_text import render_coverage, render_run

DATA = Path(__file__).resolve().parents[1] / "data" / "policytest"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"


def test_passing_file_passes_every_case() -> None:
    run = run_tests([str(DATA / "small" / "small.sbtest.yaml")], jobs=1)
    assert (run.count("passed"), run.count("failed"), run.count("error")) == (4, 0, 0)
    assert not run.all_diagnostics


def test_failures_keep_expected_actual_and_the_explain_trace() -> None:
    run = run_tests([str(DATA / "failing" / "failing.sbtest.yaml")], jobs=1)
    by_name = {c.name: c for c in run.files[0].cases}
    push = by_name["push is expected to pass but is blocked"]
    assert push.status == "failed"
    assert push.mismatches == ("decision", "rule")
    assert push.expected == {"decision": "allow", "rule": "git-status"}
    assert push.actual is not None
    assert (push.actual.decision, push.actual.code, push.actual.rule) == (
        "deny", "SANDBOX.CAPABILITY_BLOCKED", "no-push")
    assert push.line == 10
    assert "forbid        match           no-push" in push.explain_text
    assert [s["node"] for s in push.trace][-1] == "decision"
    wrong_rule = by_name["read blamed on the wrong rule"]
    assert wrong_rule.mismatches == ("rule",)
    assert by_name["git status"].status == "passed"
    assert by_name["git status"].explain_text == ""  # passes are not rendered


def test_text_report_shows_expected_and_actual_side_by_side_and_the_trace() -> None:
    run = run_tests([str(DATA / "failing" / "failing.sbtest.yaml")], jobs=1)
    text = render_run(run, verbose=False, coverage=None, threshold=None)
    block = text.split("FAIL  ")[1]
    lines = block.splitlines()
    assert lines[0].endswith("failing.sbtest.yaml:10:5: push is expected to pass but is blocked")
    header, decision, code, rule = lines[1:5]
    assert header.split() == ["expected", "actual"]
    assert decision.split() == ["decision", "allow", "deny", "<-", "differs"]
    assert code.split() == ["code", "(not", "checked)", "SANDBOX.CAPABILITY_BLOCKED"]
    assert rule.split() == ["rule", "git-status", "no-push", "<-", "differs"]
    assert "  reason: forbid rule `no-push` blocks `git`" in block
    assert "    trace:" in block
    assert "DENY  SANDBOX.CAPABILITY_BLOCKED (HTTP 403)" in block
    assert text.splitlines()[-1].startswith("FAILED: 2 failed, 2 passed in 1 test file")


def test_coverage_lists_the_rule_that_never_fired_with_its_file_and_line() -> None:
    run = run_tests([str(DATA / "small" / "small.sbtest.yaml")], jobs=1)
    cov = summarize(run.coverage)
    assert len(cov) == 1
    assert (cov[0].total, cov[0].fired) == (4, 3)
    assert cov[0].percent == 75.0
    assert [(r.id, r.line, r.column, r.effect) for r in cov[0].unfired] == [
        ("never-used", 8, 1, "permit")]
    assert os.path.realpath(cov[0].unfired[0].file) == os.path.realpath(
        DATA / "small" / "small.sbpolicy")
    text = render_coverage(cov, threshold=80)
    assert "small.sbpolicy:8:1  permit never-used" in text
    assert "coverage 75.0% is below the threshold 80% by 5.0 points" in text


def test_a_rule_that_only_matched_counts_as_fired_one_never_matched_does_not() -> None:
    # `no-push` is visited (no-match) by the git status case and fires only in the push case
    run = run_tests([str(DATA / "failing" / "failing.sbtest.yaml")], jobs=1, keyword="status")
    fired = {s.id for k, s in run.coverage.sites.items() if k in run.coverage.fired}
    assert fired == {"git-status"}


def test_org_examples_pass_with_full_coverage() -> None:
    run = run_tests([str(EXAMPLES / "org.sbtest.yaml")], jobs=1)
    assert run.count("failed") == 0
    assert run.count("error") == 0
    assert run.total >= 25
    cov = summarize(run.coverage)
    assert {Path(f.file).name for f in cov} == {"org.sbpolicy", "network.sbpolicy",
                                                "secrets.sbpolicy"}
    assert total_percent(cov) == 100.0


def test_keyword_filters_cases_case_insensitively() -> None:
    run = run_tests([str(DATA / "small" / "small.sbtest.yaml")], jobs=1, keyword="GIT")
    assert [c.name for c in run.files[0].cases] == ["git status", "git push is blocked"]
    assert run.files[0].deselected == 2


def test_broken_policy_is_reported_once_per_file_with_its_own_diagnostics() -> None:
    run = run_tests([str(DATA / "broken" / "broken.sbtest.yaml")], jobs=1)
    ids = [d.id for d in run.all_diagnostics]
    assert "SBP103" in ids
    assert ids[-1] == "SBP409"
    assert run.total == 0


def test_unknown_want_rule_and_unusable_grant_make_error_cases(tmp_path: Path) -> None:
    shutil.copytree(DATA / "fixtures", tmp_path / "fixtures")
    shutil.copy(DATA / "small" / "small.sbpolicy", tmp_path / "s.sbpolicy")
    (tmp_path / "fixtures" / "bad-grant.json").write_text('{"tenant": 1}')
    (tmp_path / "s.sbtest.yaml").write_text(
        "policy: s.sbpolicy\nmanifest: fixtures/shell.json\ngrant: fixtures/shell-agent.json\n"
        "cases:\n"
        "  - name: typo in the rule\n    op: {kind: tmp.alloc, size_bytes: 1}\n"
        "    want_decision: deny\n    want_rule: no-pussh\n"
        "  - name: bad grant\n    grant: fixtures/bad-grant.json\n"
        "    op: {kind: tmp.alloc, size_bytes: 1}\n    want_decision: deny\n")
    run = run_tests([str(tmp_path / "s.sbtest.yaml")], jobs=1)
    assert [c.status for c in run.files[0].cases] == ["error", "error"]
    diags = run.all_diagnostics
    assert diags[0].id == "SBP410"
    assert diags[0].span is not None
    assert diags[0].span.line == 5
    grant_diags = [d for d in diags if d.id == "SBP105"]
    assert grant_diags
    assert all("needed by case `bad grant`" in d.notes[-1] for d in grant_diags)


def test_worker_pool_gives_the_same_results_as_one_process(tmp_path: Path) -> None:
    shutil.copytree(DATA / "fixtures", tmp_path / "fixtures")
    text = (DATA / "small" / "small.sbtest.yaml").read_text().replace(
        "../fixtures", "../../fixtures")
    for i in range(40):
        d = tmp_path / f"d{i // 10}" / f"p{i}"
        d.mkdir(parents=True)
        shutil.copy(DATA / "small" / "small.sbpolicy", d / "small.sbpolicy")
        case_text = text if i != 7 else text.replace("want_rule: read-src", "want_rule: no-push")
        (d / "small.sbtest.yaml").write_text(case_text)
    files = discover((str(tmp_path),)).files
    serial = run_tests(files, jobs=1)
    pooled = run_tests(files, jobs=2)
    assert [(f.path, [(c.name, c.status) for c in f.cases]) for f in pooled.files] == [
        (f.path, [(c.name, c.status) for c in f.cases]) for f in serial.files]
    assert pooled.count("failed") == 1
    assert pooled.count("passed") == 159
    assert summarize(pooled.coverage) == summarize(serial.coverage)
    assert len(summarize(pooled.coverage)) == 40
