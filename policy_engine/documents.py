"""Which engine document a JSON/YAML file is, and checking it the way the engine loads it.

`check` and `lint` accept every file the engine reads: policies and `tool`-block manifests
(the compiler), and the JSON/YAML documents here: manifests, grants, requests, operator
settings, engine configurations and policy-test files. The kind is told by the keys a document
uses (a grant has `tenant`/`capabilities`, a request an `op`, ...), by the `.sbtest.yaml`
suffix, or given explicitly; every problem is a diagnostic with the file, line and column.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from policy_engine.compiler.loaders import (
    PositionLookup,
    check_patterns,
    parse_document,
    refuse_session,
    validate_document,
)
from policy_engine.dsl.source import read_source
from policy_engine.errors import Diagnostic, DiagnosticsError
from policy_engine.inputs.bounded import MAX_DOCUMENT_BYTES
from policy_engine.model import Grant, Manifest, Settings

DOCUMENT_SUFFIXES = (".json", ".yaml", ".yml")
KINDS = ("manifest", "grant", "request", "settings", "config", "test", "sandbox")
"""Document kinds, in the order a tie in :func:`detect_kind` is broken (never silently)."""

_CONFIG_KEYS = frozenset({
    "state_dir", "backends", "mode", "fallback_to_local", "evidence_sinks", "budget_meter",
    "revocation", "options",
})
_MARKERS: Mapping[str, frozenset[str]] = {
    "manifest": frozenset({"name", "version", "permissions", "side_effects", "safety_class",
                           "input_schema", "output_schema", "profile"}),
    "grant": frozenset({"tenant", "subject_id", "tool_name", "call_id", "capabilities",
                        "decision_key_fingerprint", "consent", "budget"}),
    "request": frozenset({"op", "now_ms", "overrides", "budget_used", "expect", "context"}),
    "settings": frozenset({"root_fs", "tmp_dir"}),
    "config": _CONFIG_KEYS,
    "test": frozenset({"cases", "policy"}),
    "sandbox": frozenset({"enabled", "filesystem"}),
}
"""Keys that only one kind of document uses (shared ones, `limits`, `network`, count for none)."""
# `session` is recognised to be refused (``refuse_session``): the engine's own context
_SETTINGS_KEYS = frozenset({"limits", "network", "root_fs", "tmp_dir", "session"})
_FIELDS: Mapping[str, frozenset[str]] = {
    "manifest": _MARKERS["manifest"] | {"description", "limits", "network"},
    "grant": _MARKERS["grant"] | {"limits"},
    "request": _MARKERS["request"] | {"settings", "manifest", "grant", "description"},
    "settings": _SETTINGS_KEYS,
    "config": _CONFIG_KEYS,
    "test": _MARKERS["test"] | {"manifest", "grant", "now_ms"},
    "sandbox": _MARKERS["sandbox"] | {"network"},
}
"""Every top-level key of each kind (all the models refuse others)."""


@dataclass(slots=True)
class DocumentReport:
    """What checking one document found.

    :param model: the validated grant or manifest (what the lint's capability rules read).
    """

    path: str
    kind: str | None = None
    text: str | None = None
    lookup: PositionLookup | None = None
    model: BaseModel | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)


def is_document(path: str) -> bool:
    return path.lower().endswith(DOCUMENT_SUFFIXES)


def is_test_file(path: str) -> bool:
    return bool(re.search(r"\.sbtest\.ya?ml$", path, re.IGNORECASE))


def detect_kind(data: Any, shown: str) -> str | None:
    """The kind of document ``data`` is, or ``None`` when its keys do not tell."""
    if is_test_file(shown):
        return "test"
    if not isinstance(data, dict) or not data:
        return None
    keys = set(data)
    # a kind needs more of its own keys than keys it does not know: a manifest with one
    # misspelt key is still a manifest, a CI workflow with `name` and `permissions` is not
    scores = {kind: len(keys & markers) for kind, markers in _MARKERS.items()
              if len(keys & markers) > len(keys - _FIELDS[kind])}
    if not scores:
        return "settings" if keys <= _SETTINGS_KEYS else None
    best = max(scores.values())
    winners = [k for k in KINDS if scores.get(k) == best]
    return winners[0] if len(winners) == 1 else None


def check_document(path: str, kind: str | None = None) -> DocumentReport:
    """Read, parse and validate the document at ``path`` as the engine would; never raises.

    :param kind: one of :data:`KINDS`; detected from the content when ``None``.
    """
    report = DocumentReport(path)
    text = read_source(path, path, max_bytes=MAX_DOCUMENT_BYTES)
    if isinstance(text, Diagnostic):
        report.diagnostics.append(text)
        return report
    report.text = text
    try:
        data, lookup = parse_document(text, path)
    except DiagnosticsError as exc:
        report.diagnostics.extend(exc.diagnostics)
        return report
    report.lookup = lookup
    report.kind = kind or detect_kind(data, path)
    if report.kind is None:
        report.diagnostics.append(Diagnostic.make(
            "SBP105", "cannot tell which engine document this is (manifest, grant, request, "
            "settings, config, policy test or sandbox config)", lookup.span(()),
            help="a manifest has `name`/`permissions`, a grant `tenant`/`capabilities`, a "
                 "request `op`, settings `root_fs`/`limits`, a config `backends`/`state_dir`, "
                 "a sandbox config `filesystem`; or pass `--kind`"))
        return report
    try:
        report.model = _VALIDATORS[report.kind](path, data, lookup)
    except DiagnosticsError as exc:
        report.diagnostics.extend(exc.diagnostics)
    return report


def _manifest(path: str, data: Any, lookup: PositionLookup) -> BaseModel:
    manifest = validate_document(Manifest, data, lookup, "manifest")
    check_patterns(manifest.permissions, "permissions", lookup, "manifest")
    return manifest


def _grant(path: str, data: Any, lookup: PositionLookup) -> BaseModel:
    grant = validate_document(Grant, data, lookup, "grant")
    check_patterns(grant.capabilities, "capabilities", lookup, "grant")
    return grant


def _request(path: str, data: Any, lookup: PositionLookup) -> BaseModel:
    # deferred: the request model lives with `explain`, which imports the guard
    from policy_engine.explain.request import ExplainRequest

    refuse_session(data, lookup, "settings", "session")
    request = validate_document(ExplainRequest, data, lookup, "request")
    missing = []
    for what in ("manifest", "grant"):
        rel = getattr(request, what)
        target = Path(path).parent / rel if rel is not None else None
        if target is not None and not target.is_file():
            missing.append(Diagnostic.make(
                "SBP105", f"the request's {what} `{rel}` is not a file (looked for "
                f"`{target}`)", lookup.span((what,)),
                help=f"`{what}` is a path relative to the request file"))
    if missing:
        raise DiagnosticsError(missing)
    return request


def _settings(path: str, data: Any, lookup: PositionLookup) -> BaseModel:
    refuse_session(data, lookup, "session")
    return validate_document(Settings, data, lookup, "settings")


def _config(path: str, data: Any, lookup: PositionLookup) -> None:
    from policy_engine.config import EngineConfig

    if not isinstance(data, dict):
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", "a config must be a mapping at the top level", lookup.span(()))])
    try:
        config = EngineConfig.from_mapping(data, base_dir=Path(path).parent.absolute())
        problem = _backends_problem(config)
        if problem is not None:
            raise ValueError(problem)
    except ValueError as exc:
        message = str(exc)
        # the message names the key (and, under `backends`, the op kind): point at the
        # deepest one written in the file
        loc: tuple[str, ...] = ()
        node: Any = data
        for name in re.findall(r"`([^`:]+)", message):
            if isinstance(node, dict) and name in node:
                loc, node = (*loc, name), node[name]
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", f"invalid config: {message}", lookup.span(loc),
            help="see the configuration keys in docs/operations.md")]) from None


def _backends_problem(config: Any) -> str | None:
    """What the engine would refuse at start-up: a `backends:` name no loaded plugin provides
    (the plugins installed here are asked, in a throwaway state directory)."""
    if not config.backends:
        return None
    import logging  # here: `check` of a policy or manifest needs no logging (nor its atexit)

    from policy_engine import plugin_manager
    from policy_engine.orchestration.selection import unknown_backends
    from policy_engine.plugin_manager import PluginManager, describe

    logger = logging.getLogger(plugin_manager.__name__)
    quiet, logger.disabled = logger.disabled, True  # load errors are in the answer, once
    try:
        info = describe(PluginManager.default(), config)
    finally:
        logger.disabled = quiet
    loaded = {ex["name"] for plugin in info["plugins"] for ex in plugin["executors"]}
    causes = [f"plugin `{e['plugin']}` failed to {e['stage']}: {e['message']}"
              for e in info["load_errors"]]
    return unknown_backends(config, loaded, causes)


def _test_file(path: str, data: Any, lookup: PositionLookup) -> None:
    from policy_engine.policytest.loader import load_test_file

    load_test_file(path)


def _sandbox(path: str, data: Any, lookup: PositionLookup) -> None:
    """A seed 003 `sandbox.json`, vetted as the sandbox runner reads it (docs/sandbox-config.md;
    `~` and `$VAR` from this process's environment)."""
    from policy_engine.sandbox_config.sbconfig import check_sandbox_file

    problems = [d for d in check_sandbox_file(path) if d.id != "SBP100"]
    if problems:
        raise DiagnosticsError(problems)


_VALIDATORS = {
    "manifest": _manifest, "grant": _grant, "request": _request, "settings": _settings,
    "config": _config, "test": _test_file, "sandbox": _sandbox,
}


def check_policy_file(path: str) -> list[Diagnostic]:
    """Every diagnostic of a `.sbpolicy` file: a policy (with its imports), or a header-less
    file holding only `tool` blocks, checked as the manifest `load_manifest` reads."""
    from policy_engine.compiler.pipeline import run_stages
    from policy_engine.dsl import ast

    diags = run_stages([path]).diagnostics
    if not any(d.id == "SBP200" and d.span is not None and d.span.file == path for d in diags):
        return diags
    from policy_engine.dsl.parser import parse_file  # Lark: only for a header-less file

    pf, _ = parse_file(path)
    if pf is None or pf.headers or not pf.items \
            or not all(isinstance(i, ast.ToolDef) for i in pf.items):
        return diags
    diags = run_stages([path], require_header=False).diagnostics
    if len(pf.items) > 1:
        # what `load_manifest` (run, serve, explain, test) would refuse: say it here too
        names = ", ".join(f"`{i.name.value}`" for i in pf.items if isinstance(i, ast.ToolDef))
        diags.append(Diagnostic.make(
            "SBP105", f"a tool manifest holds exactly one `tool` block, found {names}",
            pf.items[1].span, help="put each tool manifest in its own file"))
    return diags
