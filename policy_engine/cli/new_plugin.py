"""`policy-engine new-plugin NAME`: a plugin package that passes the conformance kit as generated.

The files come from ``policy_engine/templates/plugin/``: ``common/`` for every kind, then the
kind's own directory (``executor/`` or ``sink/``). ``PACKAGE`` in a path is the Python package
name, ``.tmpl`` is dropped, and ``$name``-style placeholders are filled with ``string.Template``
(generated Python and TOML hold no other ``$``).
"""

from __future__ import annotations

import re
import shlex
import string
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, EXIT_OK
from policy_engine.hookspecs import HOOK_API_VERSION

NAME_RE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
MAX_NAME = 40
# first-party executor and sink names: a plugin reusing one would collide with it at load time
RESERVED = frozenset({"fs", "tmp", "http", "proc", "docker", "browser", "bwrap",
                      "jsonl", "sqlite", "postgres", "memory", "redis"})
_TEMPLATES = "templates/plugin"


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a plugin, or ``None``."""
    if not NAME_RE.fullmatch(name) or len(name) > MAX_NAME:
        shown = ascii(name[:60])[1:-1]  # a control character must not reach the terminal
        return (f"`{shown}` is not a valid plugin name: use lowercase letters, digits and "
                f"single hyphens, starting with a letter, at most {MAX_NAME} characters "
                "(e.g. `acme-reader`)")
    if name in RESERVED:
        return f"`{name}` is the name of a first-party plugin; pick another (e.g. `acme-{name}`)"
    return None


def substitutions(name: str, kind: str) -> dict[str, str]:
    """Every placeholder the templates use."""
    snake = name.replace("-", "_")
    suffix = "Executor" if kind == "executor" else "Sink"
    check = (f"policy-engine conformance --executor {name}" if kind == "executor"
             else f"policy-engine conformance --sink {name}")
    return {
        "name": name, "kind": kind, "entry": snake, "package": f"pe_{snake}",
        "dist": f"pe-{name}", "cls": "".join(p.capitalize() for p in name.split("-")) + suffix,
        "hook_api": ".".join(map(str, HOOK_API_VERSION)), "check_command": check,
    }


def _walk(node: Traversable, rel: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """``(relative path parts, text)`` of every ``.tmpl`` file under ``node``."""
    out: list[tuple[tuple[str, ...], str]] = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.is_dir():
            out.extend(_walk(child, (*rel, child.name)))
        elif child.name.endswith(".tmpl"):
            out.append(((*rel, child.name), child.read_text(encoding="utf-8")))
    return out


def render(name: str, kind: str) -> dict[Path, str]:
    """The generated tree: relative path → content."""
    subs = substitutions(name, kind)
    root = resources.files("policy_engine").joinpath(_TEMPLATES)
    files: dict[Path, str] = {}
    for part in ("common", kind):
        for rel, text in _walk(root.joinpath(part)):
            parts = [subs["package"] if p == "PACKAGE" else p for p in rel]
            parts[-1] = parts[-1].removesuffix(".tmpl")
            files[Path(*parts)] = string.Template(text).substitute(subs)
    return files


def _refuse(message: str, hint: str) -> None:
    click.echo(f"error: {message}", err=True)
    click.echo(f"help: {hint}", err=True)
    raise SystemExit(EXIT_BAD_INPUT)


def install_line(out: Path) -> str:
    """The pip line that installs the generated folder itself: a bare `pip install pe-x` asks
    the package index for a project of that name (a dependency-confusion trap), so a relative
    folder is spelled `./DIR`, and `-e` lets the author edit it in place."""
    where = str(out) if out.is_absolute() or str(out).startswith(("./", "../")) else f"./{out}"
    return f"pip install -e {shlex.quote(where)}"


@click.command("new-plugin")
@click.argument("name")
@click.option("--dir", "target", type=click.Path(path_type=Path), default=None,
              help="directory to create the package in (default: ./pe-NAME); it must not "
                   "exist or be empty")
@click.option("--kind", type=click.Choice(["executor", "sink"]), default="executor",
              show_default=True, help="what the plugin provides")
def command(name: str, target: Path | None, kind: str) -> None:
    """Generate a plugin package (pyproject entry point, hook module, README, tests) that
    passes the conformance kit as generated: `pip install -e ./DIR` then
    `policy-engine conformance --executor NAME` (or `--sink NAME`) exits 0.

    Exit 0 when written, 2 on an invalid NAME or a target directory that is not empty.
    """
    problem = name_problem(name)
    if problem is not None:
        _refuse(problem, "the name is the executor's (or sink's) name in `backends:` and "
                "`policy-engine plugins`")
    out = target if target is not None else Path(f"pe-{name}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        _refuse(f"`{out}` already exists and is not an empty directory",
                "name a new or empty directory with `--dir`; nothing was written")
    files = render(name, kind)
    try:
        for rel, text in files.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        _refuse(f"cannot write `{out}`: {exc.strerror or exc}", "pick a writable `--dir`")
    subs = substitutions(name, kind)
    click.echo(f"created {kind} plugin `{name}` in {out} ({len(files)} files)")
    click.echo(f"next: {install_line(out)} && {subs['check_command']}")
    raise SystemExit(EXIT_OK)
