"""`policy-engine check`: parse and check policy files, printing diagnostics with carets."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from policy_engine.cli import fastexit
from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, echo_json, format_option
from policy_engine.documents import (
    KINDS,
    check_document,
    check_policy_file,
    is_document,
    is_test_file,
)
from policy_engine.dsl.render import render_diagnostic
from policy_engine.errors import Diagnostic, Severity

# A file that cannot be read at all is unusable input (exit 2), not a policy error (exit 1).
_UNUSABLE = {"SBP100", "SBP106"}


@click.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@format_option
@click.option("--kind", type=click.Choice(KINDS), default=None,
              help="what the JSON/YAML files are (default: told by their keys)")
def command(files: tuple[Path, ...], fmt: str, kind: str | None) -> None:
    """Check FILES: exit 0 when clean, 1 on errors, 2 when a file cannot be used.

    A `.sbpolicy` file is checked as its own policy (following its imports), the way CI checks
    every policy in a repository, or as a tool manifest when it holds only `tool` blocks; a
    file imported by several is reported once. JSON/YAML files are checked as the engine loads
    them: manifests, grants, requests, settings, engine configs and `*.sbtest.yaml` tests.
    """
    fastexit.request()  # nothing but reading and printing: no teardown needed at exit
    diagnostics: list[Diagnostic] = []
    for path in files:
        shown = str(path)
        found = (check_document(shown, kind).diagnostics
                 if is_document(shown) or is_test_file(shown) else check_policy_file(shown))
        for diag in found:
            if diag not in diagnostics:
                diagnostics.append(diag)
    if fmt == "json":
        echo_json({"diagnostics": [d.to_json() for d in diagnostics]})
    else:
        color = sys.stdout.isatty()
        for diag in diagnostics:
            click.echo(render_diagnostic(diag, color=color))
        errors = sum(1 for d in diagnostics if d.severity is Severity.ERROR)
        warnings = sum(1 for d in diagnostics if d.severity is Severity.WARNING)
        summary = f"{len(files)} file(s) checked: {errors} error(s), {warnings} warning(s)"
        click.echo(summary, err=bool(errors))
    if any(d.id in _UNUSABLE for d in diagnostics):
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(EXIT_FAILED if any(d.severity is Severity.ERROR for d in diagnostics) else EXIT_OK)
