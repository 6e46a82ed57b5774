"""`policy-engine conformance --executor NAME`: the executor conformance kit from the shell."""

from __future__ import annotations

from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, echo_json
from policy_engine.config import load_config
from policy_engine.conformance.harness import SetupError
from policy_engine.conformance.suite import TIMEOUT_MS, run_suite


def _setup_failure(name: str, exc: SetupError) -> None:
    click.echo(f"error: {exc}", err=True)
    if exc.executors:
        click.echo("installed executors: " + ", ".join(exc.executors), err=True)
    for e in exc.load_errors:
        click.echo(f"plugin `{e.plugin}` failed to {e.stage}: {e.message}", err=True)
    click.echo(f"help: install the plugin providing `{name}` into this Python environment "
               "(`policy-engine plugins` lists what is loaded)", err=True)


@click.command("conformance")
@click.option("--executor", "name", required=True, metavar="NAME",
              help="the installed executor to check (as `policy-engine plugins` names it)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="report format on stdout")
@click.option("--junit", "junit", type=click.Path(dir_okay=False, path_type=Path),
              help="also write a JUnit XML report to this file")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="engine configuration whose plugin `options` the executor is built with")
@click.option("--timeout-ms", type=click.IntRange(min=100), default=TIMEOUT_MS,
              show_default=True, help="profile timeout for the timeout check")
def command(name: str, fmt: str, junit: Path | None, config_path: Path | None,
            timeout_ms: int) -> None:
    """Check that an installed executor plugin honours the executor contract.

    Exit 0 when every check passes, 1 when any fails, 2 when the suite cannot run (unknown
    executor, unreadable config).
    """
    options = {}
    if config_path is not None:
        try:
            options = dict(load_config(config_path).options)
        except ValueError as exc:
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(EXIT_BAD_INPUT) from None
    try:
        report = run_suite(name, options=options, timeout_ms=timeout_ms)
    except SetupError as exc:
        _setup_failure(name, exc)
        raise SystemExit(EXIT_BAD_INPUT) from None
    if junit is not None:
        try:
            junit.write_text(report.to_junit(), encoding="utf-8")
        except OSError as exc:
            click.echo(f"error: cannot write `{junit}`: {exc.strerror}", err=True)
            raise SystemExit(EXIT_BAD_INPUT) from None
    if fmt == "json":
        echo_json(report.to_json())
    else:
        click.echo(report.to_text())
    raise SystemExit(EXIT_OK if report.ok else EXIT_FAILED)
