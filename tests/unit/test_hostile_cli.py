"""Every CLI command answers hostile input with its proper diagnostic, never a traceback.

The named cases of the fuzzing pass run through the real CLI in a child process; each must give
its own diagnostic ID at its position (not merely "no traceback"). Anything a command does not
expect goes through the one error boundary: `UNKNOWN.INTERNAL`, one line, exit 2.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hostile_cli import (
    GIT_STATUS,
    GITHUB_GET,
    HOSTILE,
    ORG,
    SHELL_GRANT,
    Ran,
    run_cli,
)

from policy_engine.cli.boundary import BoundaryGroup
from policy_engine.cli.main import COMMAND_MODULES, cli


def _diagnostic(ran: Ran, code: int, first_line: str) -> None:
    assert ran.code == code, ran
    assert "Traceback" not in ran.output, ran
    assert "UNKNOWN.INTERNAL" not in ran.output, ran
    assert first_line in ran.output, ran


def _run_args(tmp_path: Path, request: Path, *extra: str) -> list[str]:
    return ["run", "--state-dir", str(tmp_path / "state"), "--policy", str(ORG),
            "--request", str(request), *extra]


@pytest.mark.parametrize("command", ["explain", "run"])
def test_a_request_naming_no_manifest_says_so(tmp_path: Path, command: str) -> None:
    args = (["explain", "--policy", str(ORG), "--request", "noman.json"] if command == "explain"
            else _run_args(tmp_path, Path("noman.json")))
    ran = run_cli(args, HOSTILE)
    _diagnostic(ran, 2, "noman.json:1:1: SBP105 no manifest given: pass `--manifest FILE` or "
                        "set `manifest` in the request")


@pytest.mark.parametrize("command", ["explain", "run"])
def test_a_nul_byte_in_a_fixture_path_is_a_diagnostic(tmp_path: Path, command: str) -> None:
    shutil.copy(HOSTILE / "nul-path.json", tmp_path / "nul-path.json")
    shutil.copy(SHELL_GRANT, tmp_path / "grant.json")
    args = (["explain", "--policy", str(ORG), "--request", "nul-path.json"]
            if command == "explain" else _run_args(tmp_path, Path("nul-path.json")))
    ran = run_cli(args, tmp_path)
    _diagnostic(ran, 2, "nul-path.json:1:86: SBP105 invalid request field `manifest`: value "
                        "error, the path contains a NUL byte")


@pytest.mark.parametrize("command", ["explain", "run"])
def test_an_invalid_host_pattern_in_a_grant_is_refused_where_written(
        tmp_path: Path, command: str) -> None:
    args = (["explain", "--policy", str(ORG), "--request", str(GITHUB_GET)]
            if command == "explain" else _run_args(tmp_path, GITHUB_GET))
    ran = run_cli([*args, "--grant", "badhost-grant.json"], HOSTILE)
    _diagnostic(ran, 2, "badhost-grant.json:1:161: SBP207 invalid grant field "
                        "`capabilities[0].hosts[0]`: invalid character in host `a[b`")


def test_a_regex_with_1000_nested_groups_in_a_grant_is_refused(tmp_path: Path) -> None:
    grant = json.loads(SHELL_GRANT.read_text())
    grant["capabilities"] = [{"kind": "proc.exec", "tool": "git", "args": [
        {"alternatives": [{"regex": "(" * 1000 + ")" * 1000}]}]}]
    (tmp_path / "g.json").write_text(json.dumps(grant, indent=1))
    ran = run_cli(["explain", "--policy", str(ORG), "--request", str(GIT_STATUS),
                   "--grant", "g.json"], tmp_path)
    _diagnostic(ran, 2, "SBP208 invalid grant field `capabilities[0].args[0].alternatives[0]."
                        "regex`: groups nested 1000 deep; at most 50 are allowed")


@pytest.mark.parametrize("command", [["check"], ["lint"]])
def test_a_regex_with_1000_nested_groups_in_a_policy_is_sbp208(command: list[str]) -> None:
    ran = run_cli([*command, "deep-regex.sbpolicy"], HOSTILE)
    expected_exit = 1 if command == ["check"] else 2  # lint: a policy that does not compile
    _diagnostic(ran, expected_exit, "deep-regex.sbpolicy:2:35: SBP208 invalid regex")
    assert "groups nested 1000 deep; at most 50 are allowed" in ran.output


def test_explain_with_a_policy_whose_regex_nests_1000_groups_is_sbp208() -> None:
    ran = run_cli(["explain", "--policy", "deep-regex.sbpolicy", "--request", str(GIT_STATUS)],
                  HOSTILE)
    _diagnostic(ran, 2, "deep-regex.sbpolicy:2:35: SBP208 invalid regex")


def test_fmt_formats_a_policy_whose_regex_nests_1000_groups() -> None:
    # formatting needs no compiled regex: the layout changes, the regex is kept byte for byte
    source = (HOSTILE / "deep-regex.sbpolicy").read_text()
    ran = run_cli(["fmt", "-"], HOSTILE, stdin=source.encode())
    assert ran.code == 0, ran
    regex = re.compile(r"/\(+a\)+/")
    written = regex.search(source)
    assert written is not None
    assert written.group().count("(") == 1000
    formatted = regex.search(ran.out)
    assert formatted is not None
    assert formatted.group() == written.group()


@pytest.mark.parametrize("command", ["check", "explain"])
def test_a_syntax_error_does_not_also_claim_the_header_is_missing(command: str) -> None:
    args = (["check", "spurious-sbp200.sbpolicy"] if command == "check" else
            ["explain", "--policy", "spurious-sbp200.sbpolicy", "--request", str(GIT_STATUS)])
    ran = run_cli(args, HOSTILE)
    _diagnostic(ran, 1 if command == "check" else 2,
                "spurious-sbp200.sbpolicy:2:40: SBP101 unexpected `]`")
    assert "SBP200" not in ran.output


@pytest.mark.parametrize("name", ["stats-unhashable.jsonl", "stats-mixed.jsonl"])
def test_stats_counts_malformed_evidence_lines_instead_of_crashing(name: str) -> None:
    ran = run_cli(["stats", "--format", "json", name], HOSTILE)
    assert ran.code == 0, ran
    summary = json.loads(ran.out)
    assert summary["unreadable_lines"] == 1
    assert summary["calls"] == (0 if name == "stats-unhashable.jsonl" else 1)


def test_stats_counts_a_deeply_nested_evidence_line_as_unreadable(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text('{"type": "end", "status": ' + "[" * 100_000
                                      + "]" * 100_000 + "}\n")
    ran = run_cli(["stats", "--format", "json", "e.jsonl"], tmp_path)
    assert ran.code == 0, ran
    assert json.loads(ran.out)["unreadable_lines"] == 1


# ---- the boundary itself -------------------------------------------------------------------------

def test_every_command_runs_inside_the_boundary() -> None:
    assert isinstance(cli, BoundaryGroup)
    assert sorted(cli.commands) == sorted(
        {"check", "lint", "explain", "run", "schema", "plugins", "stats", "conformance",
         "test", "fmt", "serve", "tokens", "evidence", "replay", "diff", "skills", "mcp"})
    assert len(COMMAND_MODULES) == len(cli.commands)


def test_an_unexpected_exception_becomes_one_unknown_internal_line() -> None:
    group = BoundaryGroup("policy-engine")

    @group.command("boom")
    def boom() -> None:
        {}["secret-value"]  # a KeyError quoting input: the message must not be printed

    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: UNKNOWN.INTERNAL: internal error in "
                               "`policy-engine boom` (KeyError")
    assert "POLICY_ENGINE_DEBUG=1" in lines[0]
    assert "secret-value" not in result.output


def test_usage_errors_and_exits_pass_through_the_boundary_unchanged() -> None:
    group = BoundaryGroup("policy-engine")

    @group.command("quit")
    def quit_() -> None:
        raise click.UsageError("wrong usage")

    result = CliRunner().invoke(group, ["quit"])
    assert result.exit_code == 2
    assert "Error: wrong usage" in result.output
    assert "UNKNOWN.INTERNAL" not in result.output
