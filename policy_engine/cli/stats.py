"""`policy-engine stats`: summarize JSONL evidence logs (backends, rates, denials, latency)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, echo_json, format_option
from policy_engine.config import default_state_dir
from policy_engine.inputs.inputfile import cannot_read
from policy_engine.stats import read_logs, render_text, summarize


@click.command("stats")
@click.argument("logs", nargs=-1, type=click.Path(path_type=Path))
@format_option
def command(logs: tuple[Path, ...], fmt: str) -> None:
    """Summarize evidence LOGS (default: the state directory's evidence.jsonl)."""
    paths = list(logs) or [default_state_dir() / "evidence" / "evidence.jsonl"]
    try:
        read = read_logs(paths)
    except OSError as exc:
        click.echo(cannot_read("evidence log", exc.filename or "", exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
    summary = summarize(read.records)
    if fmt == "json":
        echo_json({**summary, "unreadable_lines": read.unreadable})
    else:
        click.echo(render_text(summary, unreadable=read.unreadable))
