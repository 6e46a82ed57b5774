"""`policy-engine tokens add|list|revoke`: the service's bearer tokens (stored hashed)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from policy_engine.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    echo_json,
    engine_config_or_exit,
    format_option,
)
from policy_engine.tokens import ROLES, TokenStore

_STATE = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
                      help="where tokens.sqlite lives (overrides the config)")
_CONFIG = click.option("--config", "config_path", type=click.Path(dir_okay=False,
                       path_type=Path), help="engine configuration (YAML/JSON)")


def _store(config_path: Path | None, state_dir: Path | None) -> TokenStore:
    engine = engine_config_or_exit(config_path, state_dir)
    try:  # the store shares the service's error types: a plain install has no starlette
        from policy_engine.service.pg_stores import StoreUnavailable, open_token_store
    except ImportError:
        click.echo("error: the service's tokens need the `serve` extra: "
                   "pip install 'policy-engine[serve]'", err=True)
        sys.exit(EXIT_BAD_INPUT)

    try:  # PostgreSQL when the config names one (options.service_postgres.dsn)
        return open_token_store(engine)
    except (ValueError, StoreUnavailable) as exc:
        click.echo(f"error: {getattr(exc, 'reason', exc)}", err=True)
        sys.exit(EXIT_BAD_INPUT)


@click.group("tokens")
def command() -> None:
    """Manage the bearer tokens of `policy-engine serve` (tenant + subject each)."""


@command.command("add")
@click.option("--tenant", required=True, help="tenant the token acts for")
@click.option("--subject", required=True, help="subject id the token acts as")
@click.option("--label", default="", help="a note shown by `tokens list`")
@click.option("--role", type=click.Choice(ROLES), default="agent", show_default=True,
              help="agent: calls the API; viewer, approver, admin: people using the console "
                   "(docs/console.md)")
@_CONFIG
@_STATE
@format_option
def add(tenant: str, subject: str, label: str, role: str, config_path: Path | None,
        state_dir: Path | None, fmt: str) -> None:
    """Create a token; it is printed once and only its hash is stored."""
    store = _store(config_path, state_dir)
    try:
        token, info = store.add(tenant, subject, label, role)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    finally:
        store.close()
    if fmt == "json":
        echo_json({"token": token, "token_id": info.token_id, "tenant": info.tenant,
                   "subject": info.subject, "role": info.role})
    else:
        click.echo(token)
        click.echo(f"token id {info.token_id} for tenant {tenant}, subject {subject}, role "
                   f"{role} (shown once: store it now)", err=True)


@command.command("list")
@_CONFIG
@_STATE
@format_option
def list_(config_path: Path | None, state_dir: Path | None, fmt: str) -> None:
    """List tokens (ids, tenants, subjects; never secrets)."""
    store = _store(config_path, state_dir)
    try:
        rows = store.list()
    finally:
        store.close()
    if fmt == "json":
        echo_json([{"token_id": r.token_id, "tenant": r.tenant, "subject": r.subject,
                    "label": r.label, "created_at": r.created_at, "revoked_at": r.revoked_at,
                    "role": r.role}
                   for r in rows])
        return
    for r in rows:
        state = "revoked" if r.revoked_at is not None else "live"
        click.echo(f"{r.token_id}  {state:7}  {r.role:8}  {r.tenant}  {r.subject}  "
                   f"{r.label}".rstrip())


@command.command("revoke")
@click.argument("token_id")
@_CONFIG
@_STATE
def revoke(token_id: str, config_path: Path | None, state_dir: Path | None) -> None:
    """Revoke a token by id; exits 1 when no live token has that id."""
    store = _store(config_path, state_dir)
    try:
        done = store.revoke(token_id)
    finally:
        store.close()
    if not done:
        click.echo(f"error: no live token `{token_id}`", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(f"revoked {token_id}")
