"""`policy-engine lsp`: the `.sbpolicy` language server over stdio (needs the `lsp` extra)."""

from __future__ import annotations

import sys

import click

from policy_engine.cli.common import EXIT_BAD_INPUT


@click.command("lsp")
@click.option("--stdio", is_flag=True, help="talk over standard input/output (the default; "
              "accepted because editors pass it)")
def command(stdio: bool) -> None:
    """Run the language server for `.sbpolicy` files: diagnostics from check and lint as you
    type, formatting, symbols, hover, go to definition and completion (docs/editor.md)."""
    try:
        from policy_engine.lsp.server import run
    except ImportError as exc:
        click.echo(f"error: the language server needs pygls ({exc.name or exc} is missing): "
                   "pip install 'policy-engine[lsp]'", err=True)
        sys.exit(EXIT_BAD_INPUT)
    run()
