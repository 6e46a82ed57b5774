"""`policy-engine diff OLD NEW`: the requests two policy versions decide differently (for PRs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, load_or_exit
from policy_engine.cli.replay import seal_key_of
from policy_engine.compiler import compile_files
from policy_engine.inputs.inputfile import cannot_read

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command("diff")
@click.argument("old", type=_FILE)
@click.argument("new", type=_FILE)
@click.option("--request", "requests", multiple=True, type=_FILE,
              help="a request file (explain's format; repeatable)")
@click.option("--tests", "tests", multiple=True, type=_FILE,
              help="a policy-test file, *.sbtest.yaml (repeatable): every case is a request")
@click.option("--evidence", "logs", multiple=True, type=_FILE,
              help="an evidence log (JSONL or SQLite; repeatable): every recorded call")
@click.option("--exact/--no-exact", default=True, show_default=True,
              help="compute the exact difference: every request class either version decides "
                   "differently, each with a witness decided by both")
@click.option("--boundary/--no-boundary", "legacy_boundary", default=None, hidden=True,
              help="former name of --exact/--no-exact")
@click.option("--seal-key", type=_FILE, help="replay seal key for sealed evidence records")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="take the seal key from this state directory")
@click.option("--all", "show_all", is_flag=True, help="list unchanged requests too")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]),
              default="text", show_default=True, help="output format (markdown: a PR comment)")
@click.option("--output", type=_FILE, help="write the report to this file instead of stdout")
@click.option("--fail-on", type=click.Choice(["change", "widening", "never"]), default="change",
              show_default=True,
              help="what exits 1: any change; only a widening (or a part not decided exactly, "
                   "which may hide one); nothing")
def command(old: Path, new: Path, requests: tuple[Path, ...], tests: tuple[Path, ...],
            logs: tuple[Path, ...], exact: bool, legacy_boundary: bool | None,
            seal_key: Path | None,
            state_dir: Path | None, show_all: bool, fmt: str, output: Path | None,
            fail_on: str) -> None:
    """Compare policy OLD and policy NEW (each an entry .sbpolicy file, imports followed):
    exactly, every class of requests the two decide differently (each with a witness request
    decided by both, and both deciding rules), and the given requests, tests and evidence.
    Nothing is executed.

    Exits 0 when nothing changes, 1 when some decision or limit changes or a part could not be
    decided exactly (``--fail-on widening``: only a widening or an undecided part), 2 on
    unusable input (a policy that does not compile is never diffed).
    """
    from policy_engine.analysis import render as exact_render
    from policy_engine.analysis.difference import diff
    from policy_engine.replay.diff import (
        Probe,
        compare,
        evidence_probes,
        request_probes,
        test_file_probes,
    )
    from policy_engine.replay.engine import load_calls
    from policy_engine.replay.render import to_json, to_markdown, to_text

    before = load_or_exit(lambda: compile_files([old]))
    after = load_or_exit(lambda: compile_files([new]))
    probes: list[Probe] = []
    probes += load_or_exit(lambda: list(request_probes(requests)))
    probes += load_or_exit(lambda: list(test_file_probes(tests)))
    key = seal_key_of(seal_key, state_dir)
    for log in logs:
        try:
            probes += evidence_probes(load_calls(log), key)
        except OSError as exc:
            click.echo(cannot_read("evidence log", log, exc), err=True)
            sys.exit(EXIT_BAD_INPUT)
        except ValueError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    exact = exact if legacy_boundary is None else legacy_boundary
    report = diff(before, after) if exact else None
    results = compare(before, after, probes)
    title = f"Policy diff: `{old.name}` → `{new.name}`"
    if fmt == "json":
        data = {"old": str(old), "new": str(new), **to_json(results, show_all=show_all)}
        if report is not None:
            data["exact"] = exact_render.to_json(report)
        text = json.dumps(data, indent=2, ensure_ascii=False)
    elif fmt == "markdown":
        parts = [f"### {title}", ""]
        if report is not None:
            parts += exact_render.to_markdown(report) + [""]
        if probes or report is None:
            parts.append(to_markdown(results, title="Given requests").replace("### ", "#### "))
        text = "\n".join(parts).rstrip()
    else:
        texts = [to_text(results, show_all=show_all)] if probes or report is None else []
        if report is not None:
            texts.append(exact_render.to_text(report))
        text = "\n".join(texts)
    if output is None:
        click.echo(text)
    else:
        try:
            output.write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            click.echo(f"error: cannot write `{output}`: {exc.strerror or exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    undecided = report is not None and not report.exact
    if fail_on == "widening":
        failed = undecided or (report is not None and any(c.widening for c in report.changes)) \
            or any(r.status == "changed" and r.new is not None and r.new.decision == "allow"
                   for r in results)
    else:
        failed = fail_on == "change" and (undecided or any(r.status == "changed" for r in results)
                                          or (report is not None and bool(report.changes)))
    sys.exit(EXIT_FAILED if failed else EXIT_OK)
