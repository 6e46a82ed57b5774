"""Engine configuration: where state lives, which backend serves which op, strict or compat."""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from policy_engine.inputs.bounded import MAX_DOCUMENT_BYTES, DocumentError, parse_json, parse_yaml
from policy_engine.inputs.inputfile import cannot_read, read_bounded
from policy_engine.model import OpKind

_LIST_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")

DEFAULT_BACKENDS: Mapping[OpKind, str] = {
    OpKind.FS_READ: "fs",
    OpKind.FS_WRITE: "fs",
    OpKind.FS_LIST: "fs",
    OpKind.TMP_ALLOC: "tmp",
    OpKind.PROC_EXEC: "proc-bwrap",
    OpKind.NET_HTTP: "http",
    OpKind.BROWSER_NAV: "browser",
    OpKind.BROWSER_SCREENSHOT: "browser",
}
"""The preferred first-party backend of each op kind; docker is only used when configured."""


def default_state_dir() -> Path:
    """``$POLICY_ENGINE_STATE`` or ``./var`` — embedded defaults: SQLite and local files."""
    return Path(os.environ.get("POLICY_ENGINE_STATE", "var")).absolute()


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Configuration shared with every plugin through the hooks.

    :param state_dir: evidence logs, SQLite databases and spools live here.
    :param backends: op kind → executor name; a configured backend must be loaded. A kind not
        configured prefers its ``DEFAULT_BACKENDS`` entry when loaded, else the first loaded
        executor serving it.
    :param mode: ``strict`` refuses a profile a backend cannot enforce; ``compat`` runs degraded
        and records why in the evidence.
    :param fallback_to_local: when the chosen backend is unavailable, run on the local one
        instead of failing (seed 004; off by default — security first).
    :param evidence_sinks: names of the sinks to write to (``jsonl`` by default).
    :param budget_meter: ``sqlite`` (default), ``memory``, or a plugin's (``redis``).
    :param revocation: where revoked grants are listed: ``sqlite`` (``state_dir``), ``memory``,
        ``none``, or the name of a list a plugin provides (``redis``).
    :param options: plugin-specific options, namespaced by plugin (``{"docker": {...}}``).
    :param profile_cache_size: built profiles (and the guard's compiled profiles) kept per
        policy, least recently used dropped first; each grant shape's template is kept too,
        up to a quarter of this (at least 16).
    :param warm_ahead: executors do, when they are made, the work later calls reuse (the proc
        and docker executors' walk of the system trees for the mandatory denies, with a watch
        on each directory: ≈ 0.2–0.35 s of CPU); ``False``: the first call that needs it
        starts it, and a process that makes no such call never pays for it. Set by the face,
        not the configuration file: a server (`serve`, `mcp`, the Python API's default) warms
        ahead so its first call plans in milliseconds; a one-call CLI command (`run`,
        `explain`, `plugins`, `sandbox`) does not.
    """

    state_dir: Path = field(default_factory=default_state_dir)
    backends: Mapping[OpKind, str] = field(default_factory=dict)
    mode: Literal["strict", "compat"] = "strict"
    fallback_to_local: bool = False
    evidence_sinks: tuple[str, ...] = ("jsonl",)
    budget_meter: str = "sqlite"
    revocation: str = "sqlite"
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    profile_cache_size: int = 4096
    warm_ahead: bool = True

    def plugin_options(self, plugin: str) -> Mapping[str, Any]:
        return self.options.get(plugin, {})

    def wants_sink(self, name: str) -> bool:
        """Whether sink ``name`` is configured (``"*"`` asks for all, e.g. to list plugins)."""
        return name in self.evidence_sinks or "*" in self.evidence_sinks

    def wants_meter(self, name: str) -> bool:
        """Whether meter ``name`` is configured (``"*"`` asks every plugin for its meter)."""
        return self.budget_meter in (name, "*")

    @staticmethod
    def from_mapping(data: Mapping[str, Any], *, base_dir: Path | None = None) -> EngineConfig:
        """Build a configuration from parsed YAML/JSON, refusing unknown keys and bad values.

        :param base_dir: a relative ``state_dir`` is taken relative to this directory (the
            config file's), so a config means the same wherever the engine is started.
        :raises ValueError: naming the offending key.
        """
        known = set(EngineConfig.__dataclass_fields__) - {"warm_ahead"}  # the face's choice
        unknown = sorted(set(data) - known)
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), sorted(known), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            raise ValueError(f"unknown configuration key `{unknown[0]}`{hint}")
        kwargs: dict[str, Any] = {}
        if "state_dir" in data:
            state = Path(str(data["state_dir"])).expanduser()
            if not state.is_absolute():
                state = (base_dir or Path.cwd()) / state
            kwargs["state_dir"] = state.absolute()
        if "backends" in data:
            backends = data["backends"]
            if not isinstance(backends, Mapping):
                raise ValueError("`backends` must map op kinds to executor names")
            kinds = [k.value for k in OpKind]
            for k in backends:
                if k not in kinds:
                    close = difflib.get_close_matches(str(k), kinds, n=1)
                    hint = f"; did you mean `{close[0]}`?" if close else ""
                    raise ValueError(f"`backends`: `{k}` is not an op kind{hint} "
                                     f"(op kinds: {', '.join(kinds)})")
            kwargs["backends"] = {OpKind(k): str(v) for k, v in backends.items()}
        if "mode" in data:
            if data["mode"] not in ("strict", "compat"):
                raise ValueError("`mode` must be `strict` or `compat`")
            kwargs["mode"] = data["mode"]
        if "fallback_to_local" in data:
            if not isinstance(data["fallback_to_local"], bool):
                raise ValueError("`fallback_to_local` must be a boolean")
            kwargs["fallback_to_local"] = data["fallback_to_local"]
        if "evidence_sinks" in data:
            sinks = data["evidence_sinks"]
            if isinstance(sinks, str) or not isinstance(sinks, list | tuple):
                raise ValueError("`evidence_sinks` must be a list of sink names")
            kwargs["evidence_sinks"] = tuple(str(s) for s in sinks)
        if "budget_meter" in data:
            kwargs["budget_meter"] = str(data["budget_meter"])
        if "revocation" in data:
            if not isinstance(data["revocation"], str) or not _LIST_NAME.fullmatch(
                    data["revocation"]):
                raise ValueError("`revocation` must be `sqlite`, `memory`, `none` or the name "
                                 "of a plugin's list (e.g. `redis`)")
            kwargs["revocation"] = data["revocation"]
        if "profile_cache_size" in data:
            size = data["profile_cache_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError("`profile_cache_size` must be a whole number of at least 1")
            kwargs["profile_cache_size"] = size
        if "options" in data:
            options = data["options"]
            if not isinstance(options, Mapping) or not all(
                isinstance(v, Mapping) for v in options.values()
            ):
                raise ValueError("`options` must map plugin names to mappings")
            kwargs["options"] = {str(k): dict(v) for k, v in options.items()}
        return EngineConfig(**kwargs)


def load_config(path: Path) -> EngineConfig:
    """Read an :class:`EngineConfig` from a YAML or JSON file.

    :raises ValueError: the file is unreadable, not a mapping, or has a bad key or value.
    """
    try:
        raw = read_bounded(path, MAX_DOCUMENT_BYTES)  # regular files only: never blocks
        text = raw.decode("utf-8")
    except (OSError, ValueError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            raise ValueError(f"config `{path}` is not UTF-8 text") from None
        raise ValueError(cannot_read("config", path, exc).removeprefix("error: ")) from None
    try:
        # bounded like every other document: depth, aliases, integers, duplicate keys
        data = (parse_json if path.suffix == ".json" else parse_yaml)(text)[0]
    except DocumentError as exc:
        raise ValueError(f"config `{path}`:{exc.line}:{exc.column}: {exc.message}") from None
    except Exception as exc:
        # PyYAML is imported by `parse_yaml` only (not on start-up): if it is not loaded, the
        # error cannot be one of its own
        yaml = sys.modules.get("yaml")
        if not isinstance(exc, (ValueError, RecursionError)) and (
                yaml is None or not isinstance(exc, yaml.YAMLError)):
            raise
        raise ValueError(f"config `{path}` is not valid YAML/JSON: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(f"config `{path}` must be a mapping")
    return EngineConfig.from_mapping(data, base_dir=path.parent.absolute())
