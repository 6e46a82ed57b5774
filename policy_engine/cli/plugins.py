"""`policy-engine plugins`: loaded plugins, their source, executors, sinks, meters and errors."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from policy_engine import plugin_manager
from policy_engine.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    echo_json,
    engine_config_or_exit,
    format_option,
)
from policy_engine.plugin_manager import PluginManager, describe


def _render(info: dict[str, Any]) -> str:
    lines: list[str] = []
    for plugin in info["plugins"]:
        where = f"{plugin['distribution'] or '?'} {plugin['version'] or ''}".strip()
        lines.append(f"{plugin['name']}  ({where})  {plugin['file'] or plugin['module']}")
        for ex in plugin["executors"]:
            caps = ex["capabilities"]
            flags = [k for k, v in caps.items() if v is True]
            lines.append(f"  executor {ex['name']}: ops {', '.join(caps['op_kinds'])}; "
                         f"network {', '.join(caps['network_modes'])}; "
                         f"{', '.join(flags) or 'no isolation features'}"
                         + "".join(f"; isolation {i}" for i in caps.get("isolation", ()))
                         + (f"; UNAVAILABLE here: {ex['unavailable']}" if "unavailable" in ex
                            else ""))
        lines.extend(f"  sink {name}" for name in plugin["sinks"])
        lines.extend(f"  meter {name}" for name in plugin["meters"])
    for missing in info.get("not_installed", ()):
        lines.append(f"{missing['plugin']}  (not installed: needs `{missing['module']}`)  "
                     f"available with `{missing['install']}`")
    return "\n".join(lines)


@contextmanager
def _errors_not_logged() -> Iterator[None]:
    """The manager logs each load error as it happens (what a service wants); this command
    reports them itself, so logging them too would print each twice."""
    logger = logging.getLogger(plugin_manager.__name__)
    saved = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = saved


@click.command("plugins")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="engine configuration (YAML/JSON) passed to the plugins' factories")
@format_option
def command(config_path: Path | None, fmt: str) -> None:
    """List plugins found in the `policy_engine.plugins` entry-point group.

    Exit 0 when every plugin loaded, 1 when one failed to import, validate or build (each
    failure printed once, on stderr; in `load_errors` with `--format json`), 2 on a bad config.
    An optional plugin whose extra is not installed is listed with its install line (in
    `not_installed`), not an error.
    """
    config = engine_config_or_exit(config_path, one_call=True)
    with _errors_not_logged():
        info = describe(PluginManager.default(), config)
    errors = info["load_errors"]
    if fmt == "json":
        echo_json(info)
    else:
        click.echo(_render(info))
        for e in errors:
            click.echo(f"error: plugin `{e['plugin']}` failed to {e['stage']}: {e['message']}",
                       err=True)
    raise SystemExit(EXIT_FAILED if errors else EXIT_OK)
