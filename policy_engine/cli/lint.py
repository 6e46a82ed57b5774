"""`policy-engine lint`: the SBP3xx rule catalogue over policy files, in four output formats."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from policy_engine.documents import KINDS
from policy_engine.errors import Severity
from policy_engine.lint import RULES, LintConfig, LintResult, lint_paths
from policy_engine.lint.output import FORMATS
from policy_engine.lint.output.text import render_text


def _ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> frozenset[str]:
    out = {v.strip().upper() for value in values for v in value.split(",") if v.strip()}
    unknown = sorted(out - set(RULES))
    if unknown:
        raise click.BadParameter(
            f"unknown lint rule {', '.join(unknown)} (see docs/lint-rules.md for SBP3xx IDs)")
    return frozenset(out)


def exit_code(result: LintResult, *, deny_warnings: bool) -> int:
    """2 unusable input; 1 an unsuppressed error (or warning with ``deny_warnings``); else 0.
    Notes never fail."""
    if result.unusable:
        return EXIT_BAD_INPUT
    failing = {Severity.ERROR, Severity.WARNING} if deny_warnings else {Severity.ERROR}
    return EXIT_FAILED if any(f.severity in failing for f in result.active()) else EXIT_OK


@click.command("lint")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="text",
              show_default=True, help="text, json, sarif (GitHub code scanning) or github "
              "(workflow annotations)")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="write the report to this file instead of stdout")
@click.option("--deny-warnings", is_flag=True, help="warnings fail too (exit 1)")
@click.option("--select", multiple=True, callback=_ids, metavar="IDS",
              help="only these rules (comma-separated or repeated)")
@click.option("--ignore", multiple=True, callback=_ids, metavar="IDS",
              help="never these rules (comma-separated or repeated)")
@click.option("--kind", type=click.Choice(KINDS), default=None,
              help="what the JSON/YAML files are (default: told by their keys)")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="worker processes for large inputs (default: the CPUs available)")
def command(paths: tuple[str, ...], fmt: str, output: Path | None, deny_warnings: bool,
            select: frozenset[str], ignore: frozenset[str], kind: str | None,
            jobs: int | None) -> None:
    """Lint PATHS (files, or directories searched for *.sbpolicy and JSON/YAML documents).

    Policies and `tool`-block manifests get the SBP3xx rules; JSON/YAML manifests, grants,
    requests, settings, engine configs and `*.sbtest.yaml` tests are checked as the engine
    loads them, and the capabilities of manifests and grants get the permit rules.

    Exit 0 when nothing fails, 1 on an unsuppressed error finding (or warning with
    --deny-warnings), 2 when an input cannot be used (missing, unreadable, does not parse or
    compile). Suppress a finding with `# sbpolicy: ignore SBP301 reason="..."`.
    """
    result = lint_paths(list(paths), LintConfig(select=select, ignore=ignore), jobs=jobs,
                        kind=kind)
    if fmt == "text":
        report = render_text(result, color=output is None and sys.stdout.isatty())
    else:
        report = FORMATS[fmt](result)
    if output is None:
        click.echo(report, nl=False)
    else:
        try:
            output.write_text(report, encoding="utf-8")
        except OSError as exc:
            click.echo(f"error: cannot write `{output}`: {exc.strerror or exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    sys.exit(exit_code(result, deny_warnings=deny_warnings))
