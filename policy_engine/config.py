"""Engine configuration: where state lives, which backend serves which op, strict or compat."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from policy_engine.model import OpKind


def default_state_dir() -> Path:
    """``$POLICY_ENGINE_STATE`` or ``./var`` — embedded defaults: SQLite and local files."""
    return Path(os.environ.get("POLICY_ENGINE_STATE", "var")).absolute()


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Configuration shared with every plugin through the hooks.

    :param state_dir: evidence logs, SQLite databases and spools live here.
    :param backends: op kind → executor name; unset kinds use the first executor serving them.
    :param mode: ``strict`` refuses a profile a backend cannot enforce; ``compat`` runs degraded
        and records why in the evidence.
    :param fallback_to_local: when the chosen backend is unavailable, run on the local one
        instead of failing (seed 004; off by default — security first).
    :param evidence_sinks: names of the sinks to write to (``jsonl`` by default).
    :param budget_meter: ``memory`` or ``sqlite``.
    :param options: plugin-specific options, namespaced by plugin (``{"docker": {...}}``).
    """

    state_dir: Path = field(default_factory=default_state_dir)
    backends: Mapping[OpKind, str] = field(default_factory=dict)
    mode: Literal["strict", "compat"] = "strict"
    fallback_to_local: bool = False
    evidence_sinks: tuple[str, ...] = ("jsonl",)
    budget_meter: str = "sqlite"
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def plugin_options(self, plugin: str) -> Mapping[str, Any]:
        return self.options.get(plugin, {})
