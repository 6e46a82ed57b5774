"""`policy-engine plugins`: loaded plugins, their source, executors, sinks, meters and errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from policy_engine.cli.common import EXIT_BAD_INPUT, echo_json, format_option
from policy_engine.config import EngineConfig, load_config
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
                         f"{', '.join(flags) or 'no isolation features'}")
        lines.extend(f"  sink {name}" for name in plugin["sinks"])
        lines.extend(f"  meter {name}" for name in plugin["meters"])
    errors = info["load_errors"]
    if errors:
        lines.append("load errors:")
        lines.extend(f"  {e['plugin']} ({e['stage']}): {e['message']}" for e in errors)
    return "\n".join(lines)


@click.command("plugins")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="engine configuration (YAML/JSON) passed to the plugins' factories")
@format_option
def command(config_path: Path | None, fmt: str) -> None:
    """List plugins found in the `policy_engine.plugins` entry-point group."""
    try:
        config = load_config(config_path) if config_path else EngineConfig()
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_BAD_INPUT) from None
    info = describe(PluginManager.default(), config)
    if fmt == "json":
        echo_json(info)
    else:
        click.echo(_render(info))
