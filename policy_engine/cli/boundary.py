"""The one error boundary every CLI command runs inside: nothing unexpected escapes as a traceback.

Bad input has its own diagnostics and exit code 2 in each command. Anything else that escapes a
command (a bug, a RecursionError, MemoryError, an OSError nobody expected) becomes one line on
standard error, ``error: UNKNOWN.INTERNAL: ...``, and exit code 2. The line names the exception
type and the innermost engine frame, never the exception's message: it may quote input (a header
value, a secret in a request) and CLI output carries redacted forms only. Set
``POLICY_ENGINE_DEBUG=1`` to get the full traceback instead.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, fail_bad_input
from policy_engine.errors import DiagnosticsError, ErrorCode, PolicyEngineError

DEBUG_ENV = "POLICY_ENGINE_DEBUG"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOT = os.path.dirname(_PACKAGE)


class BoundaryGroup(click.Group):
    """A click group whose subcommands run inside :func:`report_internal`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort,
                SystemExit, KeyboardInterrupt, GeneratorExit):
            raise
        except DiagnosticsError as exc:  # bad input a command did not catch itself
            fail_bad_input(exc)
        except PolicyEngineError as exc:
            click.echo(f"error: {exc.code.value}: {exc.reason}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except Exception as exc:  # the boundary: anything a command did not expect
            if os.environ.get(DEBUG_ENV):
                raise
            command = ctx.invoked_subcommand or ""
            click.echo(internal_line(exc, command), err=True)
            sys.exit(EXIT_BAD_INPUT)


def internal_line(exc: BaseException, command: str) -> str:
    """``error: UNKNOWN.INTERNAL: internal error in `policy-engine CMD` (Type at file:line); ..."""
    where = _innermost_engine_frame(exc)
    kind = type(exc).__name__
    what = {"MemoryError": "out of memory", "RecursionError": "nested too deeply"}.get(kind)
    cause = f"{kind}{f', {what}' if what else ''}{f' at {where}' if where else ''}"
    name = f"policy-engine {command}".strip()
    return (f"error: {ErrorCode.UNKNOWN_INTERNAL.value}: internal error in `{name}` ({cause}); "
            f"this is a bug: please report it (rerun with {DEBUG_ENV}=1 for the traceback)")


def _innermost_engine_frame(exc: BaseException) -> str:
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if path.startswith(_PACKAGE + os.sep):
            found = f"{os.path.relpath(path, _ROOT)}:{frame.lineno}"
    return found
