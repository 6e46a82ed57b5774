"""`policy-engine fmt`: rewrite `.sbpolicy` files in the canonical layout, or check/diff them."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from policy_engine.dsl.parser import MAX_POLICY_BYTES, decode_source, too_large
from policy_engine.dsl.render import render_diagnostic
from policy_engine.errors import Diagnostic
from policy_engine.fmt.runner import (
    Result,
    find_files,
    format_path,
    format_source,
    unified_diff,
    write_atomic,
)


@click.command("fmt")
@click.argument("paths", nargs=-1, required=True)
@click.option("--check", is_flag=True,
              help="write nothing; list unformatted files with a diff and exit 1 if any")
@click.option("--diff", "show_diff", is_flag=True, help="write nothing; print the changes")
@click.option("--stdin-filename", default="<stdin>", show_default=True,
              help="name for `-` in messages; its directory resolves imports")
def command(paths: tuple[str, ...], check: bool, show_diff: bool, stdin_filename: str) -> None:
    """Format PATHS (files, or directories searched for *.sbpolicy; `-` reads standard input
    and writes standard output).

    Exit 0 when done (or, with --check, when everything is formatted), 1 when --check finds
    unformatted files, 2 when a file cannot be used (syntax error, unreadable, or an output
    the soundness check refuses; such a file is never written).
    """
    color = sys.stderr.isatty()
    unusable = unformatted = reformatted = 0
    total = 0
    for stdin, item in _inputs(paths, stdin_filename):
        total += 1
        if isinstance(item, Diagnostic):
            _report([item], color)
            unusable += 1
            continue
        if item.formatted is None:
            _report(item.diagnostics, color, item.source)
            unusable += 1
            continue
        _report(item.diagnostics, color, item.source)  # notes on a sound output (SBP422)
        if check or show_diff:
            if item.changed:
                unformatted += 1
                if check:
                    click.echo(f"would reformat {item.file}", err=True)
                click.echo(unified_diff(item), nl=False)
            continue
        if stdin:
            click.echo(item.formatted, nl=False)
            reformatted += item.changed
        elif item.changed:
            problem = write_atomic(item.file, item.formatted)
            if problem is not None:
                _report([problem], color)
                unusable += 1
            else:
                reformatted += 1
                click.echo(f"reformatted {item.file}", err=True)
    _summary(total, unusable, unformatted, reformatted, check or show_diff)
    if unusable:
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(EXIT_FAILED if check and unformatted else EXIT_OK)


def _inputs(paths: tuple[str, ...], stdin_filename: str,
            ) -> Iterator[tuple[bool, Result | Diagnostic]]:
    """Each input formatted in turn, flagged when it is standard input."""
    for path in paths:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_POLICY_BYTES + 1)
            decoded = too_large(stdin_filename, MAX_POLICY_BYTES) \
                if len(data) > MAX_POLICY_BYTES else decode_source(data, stdin_filename)
            if isinstance(decoded, Diagnostic):
                yield True, decoded
                continue
            real = stdin_filename if stdin_filename != "<stdin>" else None
            yield True, format_source(decoded, stdin_filename, real_path=real)
            continue
        for found in find_files([path]):
            yield False, found if isinstance(found, Diagnostic) else format_path(found)


def _report(diags: list[Diagnostic], color: bool, source: str | None = None) -> None:
    for diag in diags:
        click.echo(render_diagnostic(diag, color=color, source=source), err=True)


def _summary(total: int, unusable: int, unformatted: int, reformatted: int,
             dry: bool) -> None:
    if dry:
        parts = [f"{unformatted} file(s) would be reformatted",
                 f"{total - unformatted - unusable} already formatted"]
    else:
        parts = [f"{reformatted} file(s) reformatted",
                 f"{total - reformatted - unusable} left unchanged"]
    if unusable:
        parts.append(f"{unusable} could not be formatted")
    click.echo(", ".join(parts), err=True)
