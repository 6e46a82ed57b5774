"""`policy-engine skills check|list`: validate skill manifests; show what each compiles to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, echo_json, format_option

_DIR = click.Path(file_okay=False, path_type=Path)


@click.group("skills")
def command() -> None:
    """Skill manifests (skills/<id>/manifest.json, seed 002 §7)."""


@command.command("check")
@click.argument("directory", type=_DIR, default=Path("skills"))
@format_option
def check(directory: Path, fmt: str) -> None:
    """Check every DIRECTORY/<id>/manifest.json against the schema and its directory name.

    Prints `file:line:col: SBP43x message`; exit 0 clean, 1 problems, 2 no such directory.
    """
    from policy_engine.dsl.render import render_diagnostic
    from policy_engine.skills.check import check_dir

    skills, diags = check_dir(directory)
    if fmt == "json":
        echo_json({"skills": [s.id for s in skills], "diagnostics": [d.to_json() for d in diags]})
    else:
        color = sys.stderr.isatty()
        for diag in diags:
            click.echo(render_diagnostic(diag, color=color), err=True)
        if not diags:
            click.echo(f"{len(skills)} skill(s) ok: {', '.join(s.id for s in skills)}")
    if not directory.is_dir():
        sys.exit(EXIT_BAD_INPUT)
    if diags:
        sys.exit(EXIT_FAILED)


@command.command("list")
@click.argument("directory", type=_DIR, default=Path("skills"))
@click.option("--root-fs", default="/workspace", show_default=True,
              help="where fs skills find inputs/, work/ and artifacts/")
@format_option
def list_skills(directory: Path, root_fs: str, fmt: str) -> None:
    """The skills, their MCP tool names, hints and the tool manifest each compiles to."""
    from policy_engine.cli.common import load_or_exit
    from policy_engine.skills.check import load_skills

    skills = load_or_exit(lambda: load_skills(directory))
    rows: list[dict[str, Any]] = [{"id": s.id, "tool": s.tool_name, "runtime": s.kind,
             "side_effects": [str(e) for e in s.side_effects()], "annotations": s.annotations(),
             "manifest": s.tool_manifest(root_fs).model_dump(mode="json", exclude_none=True)}
            for s in skills.values()]
    if fmt == "json":
        echo_json(rows)
        return
    for row in rows:
        hints = ", ".join(k for k, v in row["annotations"].items() if v)
        click.echo(f"{row['tool']:<20} {row['runtime']:<8} "
                   f"{'/'.join(row['side_effects']):<24} {hints}")
