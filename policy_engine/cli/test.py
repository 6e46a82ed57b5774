"""`policy-engine test`: run policy unit tests (`*.sbtest.yaml`), with coverage and JUnit XML."""

from __future__ import annotations

import os
import sys

import click

from policy_engine.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    NumberRange,
    echo_json,
    format_option,
)
from policy_engine.dsl.render import render_diagnostic
from policy_engine.errors import Diagnostic, Severity
from policy_engine.policytest.coverage import FileCoverage, summarize, total_percent
from policy_engine.policytest.discovery import discover
from policy_engine.policytest.junit import write_junit
from policy_engine.policytest.report_json import run_json
from policy_engine.policytest.report_text import render_run
from policy_engine.policytest.results import RunResult
from policy_engine.policytest.runner import run_tests


@click.command("test")
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.option("-k", "keyword", metavar="SUBSTRING",
              help="run only the cases whose name contains SUBSTRING (case-insensitive)")
@format_option
@click.option("--junit", "junit_path", metavar="FILE", help="also write JUnit XML to FILE")
@click.option("--coverage", "with_coverage", is_flag=True,
              help="report, per policy file, the rules that never fired")
@click.option("--threshold", type=NumberRange(0, 100), metavar="N",
              help="fail (exit 1) when rule coverage is below N percent (implies --coverage)")
@click.option("-v", "--verbose", is_flag=True, help="list passing cases too")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=0, show_default=True,
              help="worker processes; 0 uses one per CPU (only when there are many test files)")
def command(
    paths: tuple[str, ...], keyword: str | None, fmt: str, junit_path: str | None,
    with_coverage: bool, threshold: float | None, verbose: bool, jobs: int,
) -> None:
    """Run the policy tests under PATH (default `.`): test files, directories or .sbpolicy files.

    A directory is searched recursively for `*.sbtest.yaml` (`.yml`, `.json`); a .sbpolicy file
    runs the test files that name it. Exits 0 when every case passes, 1 when one fails or
    coverage is below --threshold, 2 on unusable input (a bad test file, a policy that does
    not compile). The format is described in docs/policy-tests.md.
    """
    found = discover(paths)
    run = run_tests(found.files, keyword=keyword, needs_policy=found.needs_policy,
                    jobs=jobs or None) if found.files else RunResult()
    run.diagnostics.extend(found.diagnostics)
    run.diagnostics.extend(_selection_problems(found.policies, run, paths, keyword))
    cov = summarize(run.coverage) if with_coverage or threshold is not None else None
    code = _exit_code(run, cov, threshold)
    diags = run.all_diagnostics
    if diags:
        color = sys.stderr.isatty()
        click.echo("\n\n".join(render_diagnostic(d, color=color) for d in diags), err=True)
    if fmt == "json":
        echo_json(run_json(run, coverage=cov, threshold=threshold, exit_code=code))
    else:
        click.echo(render_run(run, verbose=verbose, coverage=cov, threshold=threshold))
    if junit_path is not None:
        try:
            write_junit(run, junit_path)
        except OSError as exc:
            click.echo(f"error: cannot write the JUnit report `{junit_path}`: "
                       f"{exc.strerror or exc}", err=True)
            code = EXIT_BAD_INPUT
    sys.exit(code)


def _selection_problems(policies: dict[str, str], run: RunResult, paths: tuple[str, ...],
                        keyword: str | None) -> list[Diagnostic]:
    """Arguments that selected nothing: a policy no test file names, a -k matching no case."""
    out = []
    for real, raw in policies.items():
        if not any(real in f.names_policies for f in run.files):
            out.append(Diagnostic.make(
                "SBP408", f"no test file under `{_dir_of(raw)}` names `{raw}` in its `policy`",
                None))
    loaded = [f for f in run.files if not (f.diagnostics and not f.cases and not f.deselected)]
    if not run.files and not run.diagnostics and not out:
        where = ", ".join(f"`{p}`" for p in paths) or "`.`"
        out.append(Diagnostic.make("SBP400", f"no test files under {where}", None))
    elif keyword and loaded and run.total == 0:
        out.append(Diagnostic.make(
            "SBP407", f"`-k {keyword}` matches none of the "
            f"{sum(f.deselected for f in run.files)} case(s) found", None))
    return out


def _dir_of(path: str) -> str:
    return os.path.dirname(os.path.normpath(path)) or "."


def _exit_code(run: RunResult, cov: list[FileCoverage] | None, threshold: float | None) -> int:
    if any(d.severity is Severity.ERROR for d in run.all_diagnostics):
        return EXIT_BAD_INPUT
    if run.count("failed") or run.count("error"):
        return EXIT_FAILED
    if cov is not None and threshold is not None and total_percent(cov) < threshold:
        return EXIT_FAILED
    return EXIT_OK
