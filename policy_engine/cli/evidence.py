"""`policy-engine evidence verify|keygen`: check a log's hash chain and signed checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, echo_json, format_option
from policy_engine.inputs.inputfile import cannot_read

if TYPE_CHECKING:
    from policy_engine.evidence.verify import Report

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.group("evidence")
def command() -> None:
    """Tamper evidence: verify a log, make a checkpoint signing key."""


@command.command("verify")
@click.argument("log", type=_FILE)
@click.option("--public-key", type=_FILE,
              help="Ed25519 public key (PEM) the checkpoints must be signed with; the last "
              "record must then be covered by a valid signed checkpoint (a cut tail or an "
              "edited last record fails) unless --allow-unsigned-tail")
@click.option("--require-signature", is_flag=True,
              help="fail unless a valid signed checkpoint covers the last record")
@click.option("--allow-unsigned-tail", is_flag=True,
              help="with --public-key: accept records after the last checkpoint (a log still "
              "being written; they are protected by the chain only)")
@click.option("--allow-unchained-prefix", is_flag=True,
              help="accept records written before chaining at the start of the log")
@click.option("--head", "head", callback=lambda _c, _p, v: _head(v),
              help="SEQ:HASH a verify printed earlier (kept outside the log): fail unless the "
              "log still holds that record, so a cut tail is caught")
@format_option
def verify(log: Path, public_key: Path | None, require_signature: bool,
           allow_unsigned_tail: bool, allow_unchained_prefix: bool, head: str | None,
           fmt: str) -> None:
    """Verify the hash chain (and checkpoint signatures) of a JSONL or SQLite evidence LOG.

    Exits 0 when intact, 1 at the first edited, deleted, inserted or reordered record (or a bad
    signature, or — with --public-key — records no signed checkpoint covers), 2 when the log
    or key cannot be read.
    """
    # with the key, an uncovered tail is what a cut tail or an edited last record looks like
    # (issue 32 item 10): fail on it unless the log is known to be still written
    require_signature = require_signature or (public_key is not None
                                              and not allow_unsigned_tail)
    from policy_engine.evidence.chain import load_public_key
    from policy_engine.evidence.verify import is_sqlite, read_jsonl, read_sqlite, verify_records

    try:
        public = load_public_key(public_key) if public_key else None
        positions: list[int] | None = None
        if is_sqlite(log):
            raws, external, positions = read_sqlite(log)
            unit = "row"
        else:
            raws, external, unit = read_jsonl(log), [], "line"
    except OSError as exc:
        click.echo(cannot_read("evidence log", log, exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    report = verify_records(raws, public, external, unit, positions)
    if head is not None and report.ok:
        report.check_head(head, unit)
    last = positions[-1] if positions else report.records - (0 if unit == "row" else 1)
    covered = report.signed_through is not None and report.signed_through >= last
    # a log whose links were all stripped would look like one written before chaining
    unchained = bool(report.legacy) and not allow_unchained_prefix
    failed = not report.ok or (require_signature and not covered) or unchained
    if fmt == "json":
        echo_json({**report.to_json(), "fully_signed": covered,
                   "ok": report.ok and not unchained})
    else:
        _render(report, log, unit, covered, require_signature, allow_unchained_prefix)
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def _render(report: Report, log: Path, unit: str, covered: bool, required: bool,
            allowed: bool) -> None:
    for p in report.problems:
        click.echo(f"{log}:{p.position}: {p.kind}: {p.message}")
    if report.legacy:
        click.echo(f"{'note' if allowed else 'error'}: the first {report.legacy} {unit}(s) "
                   "carry no chain link: written before chaining, or their links were "
                   "stripped" + ("" if allowed else " (--allow-unchained-prefix accepts a log "
                                 "written before chaining)"))
    if report.unsigned:
        click.echo(f"note: {report.checkpoints} checkpoint(s) not checked: give --public-key")
    elif report.checkpoints and report.signed_through is not None:
        click.echo(f"signed through {unit} {report.signed_through} of {report.records}")
    if not covered:
        click.echo(f"note: the records after the last valid signed checkpoint are protected by "
                   f"the chain only: an edit of the very last {unit} or a cut tail is not "
                   "detectable" + (" (required: failing)" if required else ""))
    state = "intact" if report.ok and (allowed or not report.legacy) else "TAMPERED"
    click.echo(f"{log}: {state} ({report.records} {unit}s, {report.checkpoints} checkpoints)")
    if report.ok and report.head is not None:
        click.echo(f"head: {report.head}  (keep it outside the log; `--head` checks it later)")


def _head(value: str | None) -> str | None:
    if value is None:
        return None
    seq, sep, digest = value.partition(":")
    if not sep or not seq.isdigit() or len(digest) != 64 or \
            any(c not in "0123456789abcdef" for c in digest):
        raise click.BadParameter("expected SEQ:HASH as printed by `evidence verify` "
                                 "(a record number and a 64-digit hex SHA-256)")
    return value


@command.command("keygen")
@click.argument("private_key", type=_FILE)
@click.option("--public-key", "public_path", type=_FILE,
              help="where the public key goes (default: PRIVATE_KEY with .pub appended)")
def keygen(private_key: Path, public_path: Path | None) -> None:
    """Write a new Ed25519 checkpoint signing key (PEM, mode 0600) and its public key."""
    from policy_engine.evidence.chain import generate_key

    public_path = public_path or private_key.with_name(private_key.name + ".pub")
    try:
        kid = generate_key(private_key, public_path)
    except FileExistsError:
        click.echo(f"error: `{private_key}` exists; refusing to overwrite a key", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except OSError as exc:
        click.echo(f"error: cannot write `{exc.filename}`: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    click.echo(f"key {kid}: private {private_key}, public {public_path}")
