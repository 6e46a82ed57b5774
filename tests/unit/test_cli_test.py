"""`policy-engine test`: exit codes, formats, coverage threshold, JUnit, the real script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from policy_engine.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "policytest"
EXAMPLES = ROOT / "examples" / "policies"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["test", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def test_all_passing_exits_0_with_a_summary() -> None:
    code, out, _ = invoke(str(DATA / "small"))
    assert code == 0
    assert out.strip().splitlines()[-1].startswith("OK: 4 passed in 1 test file")


def test_verbose_lists_passing_cases_with_their_lines() -> None:
    code, out, _ = invoke(str(DATA / "small"), "-v")
    assert code == 0
    assert "PASS  " in out
    assert "small.sbtest.yaml:10:5: git status (" in out


def test_a_failure_exits_1_and_shows_expected_actual_and_trace() -> None:
    code, out, _ = invoke(str(DATA / "failing"))
    assert code == 1
    assert "FAIL  " in out
    assert "<- differs" in out
    assert "trace:" in out
    assert out.strip().splitlines()[-1].startswith("FAILED: 2 failed, 2 passed")


def test_coverage_threshold_fails_below_and_passes_at_or_above() -> None:
    code, out, _ = invoke(str(DATA / "small"), "--coverage", "--threshold", "80")
    assert code == 1
    assert "never fired: " in out
    assert "small.sbpolicy:8:1  permit never-used" in out
    assert "below the threshold 80% by 5.0 points" in out
    code, out, _ = invoke(str(DATA / "small"), "--threshold", "75")
    assert code == 0
    assert "meets the threshold 75%" in out


@pytest.mark.parametrize("name", ["bad-yaml", "unknown-field", "missing-want", "bad-op-kind",
                                  "missing-policy", "duplicate-names", "bad-expectations"])
def test_malformed_test_files_exit_2_with_positioned_diagnostics(name: str) -> None:
    path = DATA / "malformed" / f"{name}.sbtest.yaml"
    code, _, err = invoke(str(path))
    assert code == 2
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith(f"{path}:")
    line, col = first[len(str(path)) + 1:].split(":")[:2]
    assert int(line) >= 1
    assert int(col) >= 1
    assert " SBP" in first
    assert "help:" in err


def test_policy_that_does_not_compile_exits_2_with_its_diagnostics() -> None:
    code, _, err = invoke(str(DATA / "broken"))
    assert code == 2
    assert "broken.sbpolicy:4:1: SBP103" in err
    assert "SBP409" in err


def test_missing_path_and_empty_directory_and_unmatched_filter(tmp_path: Path) -> None:
    code, _, err = invoke(str(tmp_path / "nope"))
    assert (code, "SBP406" in err) == (2, True)
    code, _, err = invoke(str(tmp_path))
    assert (code, "SBP400 no test files under" in err) == (2, True)
    code, _, err = invoke(str(DATA / "small"), "-k", "zzz")
    assert (code, "SBP407" in err) == (2, True)


def test_a_policy_argument_runs_the_test_files_that_name_it() -> None:
    code, out, _ = invoke(str(EXAMPLES / "org.sbpolicy"))
    assert code == 0
    assert "passed in 1 test file" in out
    code, _, err = invoke(str(EXAMPLES / "network.sbpolicy"))  # imported, but named by none
    assert code == 2
    assert "SBP408" in err


def test_json_output_has_summary_cases_and_coverage() -> None:
    code, out, _ = invoke(str(DATA / "failing"), "--format", "json", "--coverage")
    assert code == 1
    data = json.loads(out)
    assert data["summary"]["failed"] == 2
    assert data["summary"]["passed"] == 2
    assert data["summary"]["exit_code"] == 1
    failed = [c for c in data["files"][0]["cases"] if c["status"] == "failed"]
    assert failed[0]["expected"] == {"decision": "allow", "rule": "git-status"}
    assert failed[0]["actual"]["rule"] == "no-push"
    assert failed[0]["trace"]
    assert data["coverage"]["percent"] == 75.0
    assert data["coverage"]["files"][0]["unfired"][0]["line"] == 8


def test_junit_option_writes_the_report_even_when_cases_fail(tmp_path: Path) -> None:
    out = tmp_path / "report.xml"
    code, _, _ = invoke(str(DATA / "failing"), "--junit", str(out))
    assert code == 1
    root = ET.parse(out).getroot()
    assert root.get("failures") == "2"
    code, _, err = invoke(str(DATA / "small"), "--junit", str(tmp_path / "no" / "dir.xml"))
    assert code == 2
    assert "cannot write the JUnit report" in err


def test_org_examples_pass_with_full_coverage() -> None:
    code, out, _ = invoke(str(EXAMPLES), "--coverage", "--threshold", "100")
    assert code == 0, out
    assert "  total " in out
    assert "meets the threshold 100%" in out
    assert "never fired" not in out


def test_console_script_runs_the_examples(tmp_path: Path) -> None:
    script = shutil.which("policy-engine")
    assert script is not None, "the console script is installed by `pip install -e .`"
    # the package may be installed from another checkout: run this one's code
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [script, "test", "examples/policies", "--coverage", "--junit", str(tmp_path / "j.xml")],
        capture_output=True, text=True, check=False, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "OK: " in proc.stdout
    assert ET.parse(tmp_path / "j.xml").getroot().get("failures") == "0"
    proc = subprocess.run([sys.executable, "-m", "policy_engine.cli", "test",
                           str(DATA / "malformed" / "bad-yaml.sbtest.yaml")],
                          capture_output=True, text=True, check=False, cwd=ROOT, env=env)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
