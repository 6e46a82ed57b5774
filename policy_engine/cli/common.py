"""Shared CLI plumbing: loading inputs with diagnostics, exit codes and output helpers."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from policy_engine.errors import DiagnosticsError, PolicyEngineError

if TYPE_CHECKING:
    from policy_engine.config import EngineConfig

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

T = TypeVar("T")


def fail_bad_input(diagnostics_error: DiagnosticsError) -> NoReturn:
    """Print every diagnostic with its source line and caret, then exit 2."""
    from policy_engine.dsl.render import render_diagnostic

    color = sys.stderr.isatty()
    for diag in diagnostics_error.diagnostics:
        click.echo(render_diagnostic(diag, color=color), err=True)
    sys.exit(EXIT_BAD_INPUT)


def load_or_exit(loader: Callable[[], T]) -> T:
    """Run a loader; malformed input becomes diagnostics on stderr and exit code 2."""
    try:
        return loader()
    except DiagnosticsError as exc:
        fail_bad_input(exc)
    except PolicyEngineError as exc:
        click.echo(f"error: {exc.code.value}: {exc.reason}", err=True)
        sys.exit(EXIT_BAD_INPUT)


def engine_config_or_exit(config_path: Path | None,
                          state_dir: Path | None = None, *,
                          one_call: bool = False) -> EngineConfig:
    """The engine configuration of ``--config`` (defaults without one), ``--state-dir``
    applied; a malformed file is an error on stderr and exit code 2. ``one_call``: the
    command makes one call (or none) and ends, so its executors do no work ahead for later
    calls (``EngineConfig.warm_ahead``)."""
    from dataclasses import replace

    from policy_engine.config import EngineConfig, load_config

    try:
        engine = load_config(config_path) if config_path else EngineConfig()
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if one_call:
        engine = replace(engine, warm_ahead=False)
    return engine if state_dir is None else replace(engine, state_dir=state_dir.absolute())


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False))


class NumberRange(click.FloatRange):
    """A float within bounds; `nan` is refused (every comparison with it is false, so it passes
    `FloatRange` and then a gate of `nan` could never fail, a timeout of `nan` never expire)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number; give one from {self.min:g} to {self.max:g}",
                      param, ctx)
        return number


format_option = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="output format",
)
