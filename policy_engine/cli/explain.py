"""`policy-engine explain`: a dry run that says what would be decided for a request, and why."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click

from policy_engine.cli import fastexit
from policy_engine.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    echo_json,
    format_option,
    load_or_exit,
)
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.config import default_state_dir
from policy_engine.explain import explain
from policy_engine.explain.pipeline import Explanation
from policy_engine.explain.render_text import render_text
from policy_engine.explain.request import load_request, resolve_fixture
from policy_engine.guard import Guard

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command("explain")
@click.option("--policy", "policies", multiple=True, required=True, type=_FILE,
              help="a .sbpolicy file (repeatable; imports are followed)")
@click.option("--manifest", type=_FILE, help="tool manifest (JSON, YAML or .sbpolicy tool block)")
@click.option("--grant", type=_FILE, help="grant for the call (JSON or YAML)")
@click.option("--request", "request_path", required=True, type=_FILE,
              help="request file: the op and its context (JSON or YAML)")
@click.option("--config", "config_path", type=_FILE,
              help="engine config: also check the backend the run would choose (`backends`, "
                   "`mode`, executor options) against what the profile requires")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="the engine state directory the run uses, refused to every op as the run "
                   "refuses it (`builtin:engine-state`); default: the config's, else "
                   "$POLICY_ENGINE_STATE or ./var")
@format_option
def command(
    policies: tuple[Path, ...], manifest: Path | None, grant: Path | None, request_path: Path,
    config_path: Path | None, state_dir: Path | None, fmt: str,
) -> None:
    """Decide one request without running it and show the deciding rule and the trace.

    Exits 0 whenever a decision was made (allow or deny), 2 on unusable input.
    """
    if config_path is None:  # nothing but reading and printing: no teardown needed at exit
        fastexit.request()
    policyset = load_or_exit(lambda: compile_files(policies))
    request = load_or_exit(lambda: load_request(request_path))
    manifest_path = manifest or load_or_exit(
        lambda: resolve_fixture(request_path, request.manifest, "manifest"))
    grant_path = grant or load_or_exit(
        lambda: resolve_fixture(request_path, request.grant, "grant"))
    tool = load_or_exit(lambda: load_manifest(manifest_path))
    ticket = load_or_exit(lambda: load_grant(grant_path))
    if config_path is None:
        # the run's guard refuses the state dir it runs on (guard/engine_state.py): so does this
        state = state_dir if state_dir is not None else default_state_dir()
        result = explain(policyset, tool, ticket, request,
                         guard=Guard(policyset, state_dir=state.absolute()))
    else:
        result = _with_backends(config_path, state_dir, lambda **kw: explain(
            policyset, tool, ticket, request, guard=Guard(policyset, state_dir=kw.pop("state")),
            **kw))
    if fmt == "json":
        echo_json(result.to_json())
    else:
        click.echo(render_text(result))
    sys.exit(EXIT_OK)


def _with_backends(config_path: Path, state_dir: Path | None,
                   decide: Callable[..., Explanation]) -> Explanation:
    """``decide`` with the executors the config loads (built in a throwaway state directory
    and closed again: a dry run leaves nothing behind) and the run's state dir (``state``:
    ``state_dir``, else the config's); exit 2 when the engine would not start."""
    from policy_engine.config import load_config
    from policy_engine.explain.backend import judge_in_state_dir
    from policy_engine.orchestration.selection import unknown_backends
    from policy_engine.plugin_manager import PluginManager

    try:
        config = load_config(config_path)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    with tempfile.TemporaryDirectory(prefix="policy-engine-explain-") as tmp:
        real_state = (state_dir.absolute() if state_dir is not None else config.state_dir)
        config = replace(config, state_dir=Path(tmp), warm_ahead=False)  # a dry run
        plugins = PluginManager.default()
        plugins.configure(config)
        comps = plugins.components(config)
        judge_in_state_dir(comps.executors, real_state)  # the run's, not the throwaway one
        try:
            causes = [f"plugin `{e.plugin}` failed to {e.stage}: {e.message}"
                      for e in dict.fromkeys(plugins.load_errors)]
            bad = unknown_backends(config, list(comps.executors), causes)
            if bad is not None:
                click.echo(f"error: {bad}", err=True)
                sys.exit(EXIT_BAD_INPUT)
            return decide(executors=comps.executors, config=config, state=real_state)
        finally:
            comps.close()
