"""`policy-engine conformance --executor NAME`: the executor conformance kit from the shell."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, echo_json
from policy_engine.config import load_config
from policy_engine.conformance.harness import SetupError
from policy_engine.conformance.sinks import run_sink_suite
from policy_engine.conformance.suite import TIMEOUT_MS, run_suite


def _setup_failure(name: str, exc: SetupError) -> None:
    click.echo(f"error: {exc}", err=True)
    if exc.executors:
        click.echo("installed executors: " + ", ".join(exc.executors), err=True)
    for e in exc.load_errors:
        click.echo(f"plugin `{e.plugin}` failed to {e.stage}: {e.message}", err=True)
    click.echo(f"help: {exc.hint}" if exc.hint else f"help: install the plugin providing "
               f"`{name}` into this Python environment (`policy-engine plugins` lists what is "
               "loaded)", err=True)


@click.command("conformance")
@click.option("--executor", "name", default=None, metavar="NAME",
              help="the installed executor to check (as `policy-engine plugins` names it)")
@click.option("--sink", "sink", default=None, metavar="NAME",
              help="check the installed evidence sink NAME instead (stored records complete, "
                   "no raw content, durable)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="report format on stdout")
@click.option("--junit", "junit", type=click.Path(dir_okay=False, path_type=Path),
              help="also write a JUnit XML report to this file")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="engine configuration whose plugin `options` the executor is built with")
@click.option("--timeout-ms", type=click.IntRange(min=100), default=TIMEOUT_MS,
              show_default=True, help="profile timeout for the timeout check")
@click.option("--probe-timeout-ms", type=click.IntRange(min=100), default=None,
              help="profile timeout of every other probe (a probe the executor hangs on is "
                   "reported once it passes)  [default: the system default, 60 s]")
@click.option("--mode", type=click.Choice(["strict", "compat"]), default=None,
              help="strict refuses probes whose profile needs what the executor lacks; compat "
                   "runs them degraded and checks the evidence says so (honest weak backends); "
                   "default: the config's mode, else strict")
def command(name: str | None, sink: str | None, fmt: str, junit: Path | None,
            config_path: Path | None, timeout_ms: int, probe_timeout_ms: int | None,
            mode: str | None) -> None:
    """Check that an installed executor (or evidence sink) plugin honours its contract.

    Exit 0 when every check passes, 1 when any fails, 2 when the suite cannot run (unknown
    executor, unreadable config).
    """
    options = {}
    run_mode: Literal["strict", "compat"] = "compat" if mode == "compat" else "strict"
    if config_path is not None:
        try:
            config = load_config(config_path)
        except ValueError as exc:
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(EXIT_BAD_INPUT) from None
        options = dict(config.options)
        if mode is None:
            run_mode = config.mode
    if (name is None) == (sink is None):
        click.echo("error: name exactly one of `--executor NAME` or `--sink NAME`", err=True)
        raise SystemExit(EXIT_BAD_INPUT)
    try:
        if sink is not None:
            report = run_sink_suite(sink, options=options)
        else:
            assert name is not None  # INVARIANT: exactly one of the two is set
            report = run_suite(name, options=options, timeout_ms=timeout_ms, mode=run_mode,
                               probe_timeout_ms=probe_timeout_ms)
    except SetupError as exc:
        _setup_failure(name or str(sink), exc)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except ValueError as exc:  # the sink is not provided by any plugin, or its options
        click.echo(f"error: {exc}", err=True)
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
