"""`policy-engine replay`: which recorded calls a new policy would decide differently."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, echo_json, load_or_exit
from policy_engine.compiler import compile_files
from policy_engine.inputs.inputfile import MAX_KEY_BYTES, cannot_read, read_bounded

_FILE = click.Path(dir_okay=False, path_type=Path)


def seal_key_of(seal_key: Path | None, state_dir: Path | None) -> bytes | None:
    """The replay sealing key from ``--seal-key`` or ``--state-dir`` (exit 2 if unreadable)."""
    from policy_engine.recording.record import SEAL_KEY_FILE

    path = seal_key or (state_dir / SEAL_KEY_FILE if state_dir else None)
    if path is None:
        return None
    try:
        data = read_bounded(path, MAX_KEY_BYTES)
    except OSError as exc:
        click.echo(cannot_read("replay seal key", path, exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
    if len(data) < 32:
        click.echo(f"error: replay seal key `{path}` is shorter than 32 bytes", err=True)
        sys.exit(EXIT_BAD_INPUT)
    return data[:32]


@click.command("replay")
@click.option("--policy", "policies", multiple=True, required=True, type=_FILE,
              help="the NEW policy: a .sbpolicy file (repeatable; imports are followed)")
@click.option("--seal-key", type=_FILE,
              help="replay seal key (opens the sealed arguments/URL/context of each record)")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="take the seal key from this state directory (keys/replay-seal.key)")
@click.option("--all", "show_all", is_flag=True, help="list unchanged calls too")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]),
              default="text", show_default=True, help="output format")
@click.argument("evidence", type=_FILE)
def command(policies: tuple[Path, ...], seal_key: Path | None, state_dir: Path | None,
            show_all: bool, fmt: str, evidence: Path) -> None:
    """Re-decide every call recorded in EVIDENCE (JSONL or SQLite) under the new policy,
    executing nothing, and print the calls whose decision or code would change, with the
    deciding rule before and after.

    Exits 0 when nothing changes, 1 when some decision changes, 2 on unusable input.
    """
    from policy_engine.replay.engine import load_calls, replay
    from policy_engine.replay.render import to_json, to_markdown, to_text

    policyset = load_or_exit(lambda: compile_files(policies))
    key = seal_key_of(seal_key, state_dir)
    try:
        calls = load_calls(evidence)
    except OSError as exc:
        click.echo(cannot_read("evidence log", evidence, exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    results = replay(policyset, calls, key)
    if fmt == "json":
        echo_json(to_json(results, show_all=show_all))
    elif fmt == "markdown":
        click.echo(to_markdown(results, title=f"Replay of `{evidence.name}`"))
    else:
        click.echo(to_text(results, show_all=show_all))
    sys.exit(EXIT_FAILED if any(r.status == "changed" for r in results) else EXIT_OK)
