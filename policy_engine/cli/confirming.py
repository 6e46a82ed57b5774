"""The `--confirm` options every command that runs calls shares (run, mcp, serve): who stands
in for a missing consent — nobody (deny), everyone (auto, development), a terminal, a webhook,
or a person in the console (the state directory's approval queue)."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, NumberRange

if TYPE_CHECKING:
    from policy_engine.confirm.services import ConfirmationService

MODES = ("deny", "auto", "interactive", "webhook", "console")


def confirm_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--confirm``, ``--approver-url``, ``--approver-secret-file``, ``--approver-timeout``."""
    for option in reversed((
        click.option("--confirm", "confirm_mode", type=click.Choice(MODES), default="deny",
                     show_default=True,
                     help="when consent is needed and the grant has none: deny, approve "
                     "(development only), ask on the terminal, ask a signed webhook, or queue "
                     "the question for the console of `serve --console` on the same state "
                     "directory (docs/consent.md, docs/console.md)"),
        click.option("--approver-url", help="--confirm webhook: where signed requests go"),
        click.option("--approver-secret-file", type=click.Path(dir_okay=False, path_type=Path),
                     help="--confirm webhook: the shared HMAC secret (at least 16 bytes)"),
        click.option("--approver-timeout", default=30.0, show_default=True,
                     type=NumberRange(0.1, 600), help="seconds to wait for the approver"),
    )):
        func = option(func)
    return func


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _terminal() -> tuple[TextIO | None, TextIO | None]:
    """The controlling terminal, never stdin/stdout: over MCP stdio those are the protocol."""
    try:
        return open("/dev/tty", encoding="utf-8"), open("/dev/tty", "w", encoding="utf-8")  # noqa: SIM115 - they live as long as the service
    except OSError:
        return None, None


def confirmation_service(mode: str, url: str | None, secret_file: Path | None,
                         timeout: float, *, stdin_is_protocol: bool = False,
                         state_dir: Path | None = None) -> ConfirmationService:
    """The service ``--confirm`` names; exits 2 on an unusable webhook setting.

    :param stdin_is_protocol: stdin carries a protocol (MCP stdio): ``interactive`` asks on
        the controlling terminal only; otherwise a terminal stdin is asked first.
    :param state_dir: where ``console`` queues its questions.
    """
    from policy_engine.confirm.services import (
        AutoConfirmation,
        DenyConfirmation,
        InteractiveConfirmation,
        WebhookConfirmation,
    )
    from policy_engine.inputs.inputfile import MAX_KEY_BYTES, cannot_read, read_bounded

    if mode == "deny":
        return DenyConfirmation()
    if mode == "auto":
        click.echo("WARNING: --confirm auto approves every consent request (development "
                   "only); each approval is logged and recorded", err=True)
        return AutoConfirmation()
    if mode == "console":
        if state_dir is None:
            _fail("--confirm console needs the state directory the console reads")
        from policy_engine.confirm.queue import ConsoleConfirmation, approval_queue

        return ConsoleConfirmation(approval_queue(state_dir), timeout_s=timeout)
    if mode == "interactive":
        if not stdin_is_protocol and sys.stdin.isatty():
            return InteractiveConfirmation()
        tty_in, tty_out = _terminal()
        if tty_in is None:  # no terminal: every question is answered no (no_service)
            return InteractiveConfirmation(stdin=io.StringIO(), stdout=sys.stderr)
        return InteractiveConfirmation(stdin=tty_in, stdout=tty_out)
    if not url or secret_file is None:
        _fail("--confirm webhook needs --approver-url and --approver-secret-file")
    try:
        secret = read_bounded(secret_file, MAX_KEY_BYTES).strip()  # a key, not a stream
        return WebhookConfirmation(url, secret, timeout_s=timeout)
    except OSError as exc:
        _fail(cannot_read("approver secret file", secret_file, exc).removeprefix("error: "))
    except ValueError as exc:
        _fail(str(exc))

