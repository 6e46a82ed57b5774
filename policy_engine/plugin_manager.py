"""The plugin manager: registers the hookspecs, loads plugins by entry point, isolates failures.

First-party plugins (``plugins/``) and third-party ones go through the same entry-point group
and the same hooks. A plugin that fails to import, fails validation or raises from a factory
hook is recorded by name in :attr:`PluginManager.load_errors` and logged; the others still load.
A plugin whose import needs a package its distribution declares only in an extra (``budget_redis``
needs ``redis`` from ``[scale]``) is not an error: it is listed in
:attr:`PluginManager.not_installed` with the install line, and logged at debug level only.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import pluggy

from policy_engine import hookspecs
from policy_engine.budget import BudgetMeter
from policy_engine.config import EngineConfig
from policy_engine.evidence import EvidenceSink
from policy_engine.executor import Executor
from policy_engine.hookspecs import (
    ENTRY_POINT_GROUP,
    HOOK_API_ATTRIBUTE,
    HOOK_API_VERSION,
    PROJECT_NAME,
)
from policy_engine.model import Decision, ExecOp, Profile
from policy_engine.orchestration.revocation import RevocationWatcher

log = logging.getLogger(__name__)

FIRST_PARTY_DISTRIBUTION = "policy-engine"


@dataclass(frozen=True, slots=True)
class PluginSource:
    """Where a plugin came from: its distribution, version and module file."""

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None
    file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "module": self.module, "file": self.file}


@dataclass(frozen=True, slots=True)
class LoadError:
    """A plugin that could not be used, by name, with the stage that failed."""

    plugin: str
    stage: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"plugin": self.plugin, "stage": self.stage, "message": self.message}


@dataclass(frozen=True, slots=True)
class NotInstalled:
    """An optional plugin whose extra is not installed: which module it missed, which extra
    brings it and the line that installs it (a plain install, not a failure)."""

    plugin: str
    module: str
    extra: str
    distribution: str

    @property
    def install(self) -> str:
        return f"pip install '{self.distribution}[{self.extra}]'"

    def to_json(self) -> dict[str, str]:
        return {"plugin": self.plugin, "module": self.module, "extra": self.extra,
                "install": self.install}


_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)[^;]*;\s*(.*)$")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def extra_providing(ep: EntryPoint, module: str) -> tuple[str, str] | None:
    """``(distribution, extra)`` when the distribution that declares ``ep`` lists the
    top-level module ``module`` only as an optional requirement; ``None`` otherwise (a base
    dependency missing is a broken install, still an error)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    wanted = _normal(module.partition(".")[0])
    extras: list[str] = []
    for line in dist.requires or ():
        found = _REQUIREMENT.match(line)
        if found is None:  # no marker: a base dependency, never "optional"
            if _normal(re.split(r"[\s\[<>=!~;]", line.strip(), maxsplit=1)[0]) == wanted:
                return None
            continue
        marker = _EXTRA_MARKER.search(found.group(2))
        if marker is not None and _normal(found.group(1)) == wanted:
            extras.append(marker.group(1))
    # "test" and "bench" extras also list them; name the user-facing one
    usable = [e for e in extras if e not in ("test", "bench")] or extras
    return (str(dist.metadata["Name"]), usable[0]) if usable else None


@dataclass(slots=True)
class Components:
    """What the loaded plugins provide for one configuration, with the owner of each."""

    executors: dict[str, Executor] = field(default_factory=dict)
    sinks: dict[str, EvidenceSink] = field(default_factory=dict)
    meter: BudgetMeter | None = None
    meters: dict[str, BudgetMeter] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # "executor:<name>" → plugin name
    # hook stage ("evidence_sinks", "budget_meter", ...) → "plugin `X`: <exception>" for each
    # plugin that raised while building them: the real cause when a configured one is missing
    failures: dict[str, list[str]] = field(default_factory=dict)
    not_installed: tuple[NotInstalled, ...] = ()

    def unavailable(self, what: str, stage: str) -> str:
        """Why ``what`` (e.g. "evidence sink `jsonl`") is missing, with the causes if known."""
        causes = self.failures.get(stage)
        if not causes:
            hint = "".join(f"; plugin `{n.plugin}` is available with `{n.install}`"
                           for n in self.not_installed)
            return f"{what} is not provided by any loaded plugin{hint}"
        return f"{what} could not be started: " + "; ".join(causes)

    def close(self) -> None:
        """Close everything; one failing close does not stop the others."""
        closables: list[Any] = [*self.executors.values(), *self.sinks.values(),
                                *self.meters.values()]
        for item in closables:
            try:
                item.close()
            except Exception:
                log.exception("closing %r failed", item)


class _DistFacts:
    """Each distribution's name and version, its METADATA parsed once: ``Distribution``
    parses the file again on every ``metadata`` or ``version`` (three times per entry point
    here: 45 ms of every engine start)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, str, str]] = {}  # the object kept: ids stay unique

    def of(self, ep: EntryPoint | None) -> tuple[str, str] | None:
        dist = getattr(ep, "dist", None) if ep is not None else None
        if dist is None:
            return None
        got = self._seen.get(id(dist))
        if got is None:
            meta = dist.metadata
            got = self._seen[id(dist)] = (dist, str(meta["Name"]), str(meta["Version"]))
        return got[1], got[2]


def _source_of(name: str, plugin: object, dist: tuple[str, str] | None) -> PluginSource:
    module = inspect.getmodule(plugin) if not inspect.ismodule(plugin) else plugin
    file = getattr(module, "__file__", None)
    return PluginSource(
        name=name,
        distribution=dist[0] if dist is not None else None,
        version=dist[1] if dist is not None else None,
        module=module.__name__ if module is not None else None,
        file=str(file) if file else None,
    )


class PluginManager:
    """A pluggy ``PluginManager`` with the policy-engine hookspecs and failure isolation."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.load_errors: list[LoadError] = []
        self.not_installed: list[NotInstalled] = []
        self.sources: dict[str, PluginSource] = {}
        self._config: EngineConfig | None = None

    @classmethod
    def default(cls) -> PluginManager:
        """A manager with every plugin of the entry-point group loaded."""
        manager = cls()
        manager.load_entrypoints()
        return manager

    # -- loading --------------------------------------------------------------------------------

    def load_entrypoints(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load and register every entry point of ``group``; first-party ones first, then by
        name, so "first executor serving a kind" is deterministic.
        """
        eps = list(entry_points(group=group))

        facts = _DistFacts()

        def order(ep: EntryPoint) -> tuple[bool, str]:
            dist = facts.of(ep)
            return (dist is None or dist[0] != FIRST_PARTY_DISTRIBUTION, ep.name)

        for ep in sorted(eps, key=order):
            if ep.name in self.sources or self.pm.has_plugin(ep.name):
                continue  # the same distribution seen twice on sys.path
            try:
                plugin = ep.load()
            except ModuleNotFoundError as exc:
                optional = extra_providing(ep, exc.name) if exc.name else None
                if optional is None:
                    self._fail(ep.name, "import", f"{type(exc).__name__}: {exc}")
                    continue
                missing = NotInstalled(ep.name, exc.name or "", optional[1], optional[0])
                self.not_installed.append(missing)
                log.debug("plugin `%s` not loaded: `%s` is not installed (%s)", ep.name,
                          missing.module, missing.install)
                continue
            except Exception as exc:  # any import-time failure must not stop the others
                self._fail(ep.name, "import", f"{type(exc).__name__}: {exc}")
                continue
            self.register(plugin, ep.name, source=_source_of(ep.name, plugin, facts.of(ep)))

    def register(self, plugin: object, name: str, *, source: PluginSource | None = None) -> bool:
        """Register ``plugin`` under ``name`` after validating its hooks; ``False`` if refused."""
        problem = hook_api_problem(getattr(plugin, HOOK_API_ATTRIBUTE, None))
        if problem is not None:
            self._fail(name, "validate", problem)
            return False
        try:
            self.pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            self._fail(name, "validate", str(exc))
            return False
        try:
            # INVARIANT: every plugin registered before passed this check, so a failure here
            # (a hookimpl matching no spec, e.g. a misspelt hook name) is this plugin's.
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(name=name)
            self._fail(name, "validate", str(exc))
            return False
        self.sources[name] = source or _source_of(name, plugin, None)
        if self._config is not None:
            self._configure_one(name, self._config)
        return True

    def _fail(self, plugin: str, stage: str, message: str) -> None:
        self.load_errors.append(LoadError(plugin, stage, message))
        log.error("plugin `%s` failed to %s: %s", plugin, stage, message)

    # -- calling hooks, one implementation at a time ----------------------------------------

    def _impls(self, hook: str) -> list[Any]:
        caller = getattr(self.pm.hook, hook)
        return list(caller.get_hookimpls())  # registration order (pluggy calls them LIFO)

    def _call_each(self, hook: str, failures: dict[str, list[str]] | None = None,
                   **kwargs: Any) -> Iterable[tuple[str, Any]]:
        """Call each implementation separately so one raising plugin is reported by name and
        the others still contribute (a plain ``pm.hook.X()`` aborts on the first exception).
        """
        for impl in self._impls(hook):
            args = {k: kwargs[k] for k in impl.argnames}
            try:
                yield impl.plugin_name, impl.function(**args)
            except Exception as exc:
                stage = hook.removeprefix("policy_engine_")
                message = f"{type(exc).__name__}: {exc}"
                self._fail(impl.plugin_name, stage, message)
                if failures is not None:
                    failures.setdefault(stage, []).append(
                        f"plugin `{impl.plugin_name}`: {message}")

    def _configure_one(self, name: str, config: EngineConfig) -> None:
        for impl in self._impls("policy_engine_configure"):
            if impl.plugin_name == name:
                try:
                    impl.function(**{k: config for k in impl.argnames})
                except Exception as exc:
                    self._fail(name, "configure", f"{type(exc).__name__}: {exc}")

    def configure(self, config: EngineConfig) -> None:
        """Deliver ``policy_engine_configure`` (historic: later registrations get it too)."""
        self._config = config
        for name in list(self.sources):
            self._configure_one(name, config)

    def components(self, config: EngineConfig) -> Components:
        """Build the executors, the configured sinks and the configured budget meter."""
        out = Components(not_installed=tuple(self.not_installed))
        for plugin, executors in self._call_each("policy_engine_executors", out.failures,
                                                  config=config):
            for ex in executors or ():
                if not isinstance(ex, Executor):
                    self._fail(plugin, "executors", f"{ex!r} does not implement Executor")
                elif ex.name in out.executors:
                    self._fail(plugin, "executors", f"executor name `{ex.name}` already "
                               f"provided by `{out.owners['executor:' + ex.name]}`")
                else:
                    out.executors[ex.name] = ex
                    out.owners["executor:" + ex.name] = plugin
        for plugin, sinks in self._call_each("policy_engine_evidence_sinks", out.failures,
                                             config=config):
            for sink in sinks or ():
                if not isinstance(sink, EvidenceSink):
                    self._fail(plugin, "evidence_sinks", f"{sink!r} does not implement "
                               "EvidenceSink")
                elif sink.name in out.sinks:
                    self._fail(plugin, "evidence_sinks", f"sink name `{sink.name}` already "
                               f"provided by `{out.owners['sink:' + sink.name]}`")
                else:
                    out.sinks[sink.name] = sink
                    out.owners["sink:" + sink.name] = plugin
        for plugin, meter in self._call_each("policy_engine_budget_meter", out.failures,
                                             config=config):
            if meter is None:
                continue
            if not isinstance(meter, BudgetMeter):
                self._fail(plugin, "budget_meter", f"{meter!r} does not implement BudgetMeter")
            elif meter.name not in out.meters:
                out.meters[meter.name] = meter
                out.owners["meter:" + meter.name] = plugin
                if out.meter is None:  # firstresult semantics, in registration order
                    out.meter = meter
        return out

    def revocation_list(self, config: EngineConfig) -> RevocationWatcher:
        """The revocation list a plugin provides for ``config.revocation``.

        :raises ValueError: no plugin provides it, or its plugin failed to build it.
        """
        failures: dict[str, list[str]] = {}
        for _plugin, found in self._call_each("policy_engine_revocation_list", failures,
                                              config=config):
            if isinstance(found, RevocationWatcher):
                return found
        what = f"revocation list `{config.revocation}`"
        causes = failures.get("revocation_list")
        raise ValueError(f"{what} could not be started: " + "; ".join(causes) if causes
                         else f"{what} is not provided by any loaded plugin")

    def notify_decision(self, profile: Profile, op: ExecOp, decision: Decision) -> None:
        """Observation hook; a raising observer is logged and never affects the call."""
        for impl in self._impls("policy_engine_decision"):
            args = {"profile": profile, "op": op, "decision": decision}
            try:
                impl.function(**{k: args[k] for k in impl.argnames})
            except Exception:
                log.exception("plugin `%s` raised from policy_engine_decision", impl.plugin_name)

    def hooks_of(self, name: str) -> list[str]:
        plugin = self.pm.get_plugin(name)
        callers = self.pm.get_hookcallers(plugin) or [] if plugin is not None else []
        return sorted(c.name for c in callers)


def hook_api_problem(declared: object) -> str | None:
    """Why a plugin declaring hook API ``declared`` cannot load here (``None``: it can, or it
    declares nothing)."""
    if declared is None:
        return None
    ours = ".".join(map(str, HOOK_API_VERSION))
    parts = str(declared).split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return (f"{HOOK_API_ATTRIBUTE} = {str(declared)[:40]!r} is not a `MAJOR.MINOR` "
                f"version (this engine's hook API is {ours})")
    major, minor = int(parts[0]), int(parts[1])
    if major != HOOK_API_VERSION[0]:
        return (f"written for hook API {major}.{minor}; this engine has {ours} (a different "
                "major version: see docs/plugins.md, \"Hook API version\")")
    if minor > HOOK_API_VERSION[1]:
        return (f"needs hook API {major}.{minor}; this engine has {ours}: upgrade "
                "policy-engine")
    return None


def describe(manager: PluginManager, config: EngineConfig) -> dict[str, Any]:
    """Everything ``policy-engine plugins`` shows: plugins with their source, hooks, executors
    (with capabilities), sinks and meters, plus the load errors. Builds and closes components.
    """
    # "*" asks every plugin for every sink and meter it has, in a throwaway state dir so that
    # listing creates no files where real evidence lives
    with tempfile.TemporaryDirectory(prefix="policy-engine-plugins-") as tmp:
        # keyless: a throwaway sink needs no signing key made (nor the notice that one was)
        options = {**config.options, **{name: {**config.plugin_options(name),
                                               "signing_key": False}
                                        for name in ("evidence_jsonl", "evidence_sqlite")}}
        listing = replace(config, evidence_sinks=("*",), budget_meter="*", state_dir=Path(tmp),
                          options=options)
        return _describe(manager, listing)


def _unavailable(executor: object) -> dict[str, str]:
    """``{"unavailable": reason}`` for an executor whose ``available()`` says it cannot run
    here (a macOS-only backend on Linux), else nothing: the listing says why calls will fail."""
    probe = getattr(executor, "available", None)
    try:
        state = probe() if callable(probe) else True
    except Exception as exc:  # a crashing probe means unusable, as the orchestrator treats it
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    if state is True:
        return {}
    return {"unavailable": state if isinstance(state, str) and state else "reports itself "
            "unavailable"}


def _describe(manager: PluginManager, config: EngineConfig) -> dict[str, Any]:
    comps = manager.components(config)
    try:
        plugins = []
        for name, source in manager.sources.items():
            mine = {key.split(":", 1)[1] for key, owner in comps.owners.items() if owner == name}
            plugins.append({
                **source.to_json(),
                "hooks": manager.hooks_of(name),
                "executors": [
                    {"name": ex.name, "capabilities": ex.capabilities.to_json(),
                     **_unavailable(ex)}
                    for ex in comps.executors.values() if ex.name in mine
                    and comps.owners["executor:" + ex.name] == name
                ],
                "sinks": sorted(s for s in comps.sinks if comps.owners["sink:" + s] == name),
                "meters": sorted(k.split(":", 1)[1] for k, o in comps.owners.items()
                                 if k.startswith("meter:") and o == name),
            })
    finally:
        comps.close()
    # a hook that raised on every build is one problem, not one per build
    errors = list(dict.fromkeys(manager.load_errors))
    return {"python": sys.executable, "hook_api": ".".join(map(str, HOOK_API_VERSION)),
            "plugins": plugins,
            "not_installed": [n.to_json() for n in manager.not_installed],
            "load_errors": [e.to_json() for e in errors]}
