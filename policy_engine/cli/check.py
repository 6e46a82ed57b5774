"""`policy-engine check`: parse and check policy files, printing diagnostics with carets."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, echo_json, format_option
from policy_engine.compiler import check_files
from policy_engine.dsl.render import render_diagnostic
from policy_engine.errors import Diagnostic, Severity

# A file that cannot be read at all is unusable input (exit 2), not a policy error (exit 1).
_UNUSABLE = {"SBP100", "SBP106"}


@click.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@format_option
def command(files: tuple[Path, ...], fmt: str) -> None:
    """Check FILES: exit 0 when clean, 1 on errors, 2 when a file cannot be used.

    Each file is checked as its own policy (following its imports), the way CI checks every
    policy in a repository; a file imported by several is reported once.
    """
    diagnostics: list[Diagnostic] = []
    for path in files:
        for diag in check_files([path]):
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
