"""Rules SBP320-SBP322: plain http, writes to any host, and `network on` by default."""

from __future__ import annotations

from collections.abc import Iterator

from policy_engine.dsl import ast
from policy_engine.lint.model import FileView, Finding, LintConfig
from policy_engine.lint.rules.base import finding, rule_views, where
from policy_engine.lint.rules.breadth import host_patterns, is_any_host
from policy_engine.model import CapabilityKind

_NET = (CapabilityKind.NET_HTTP, CapabilityKind.BROWSER_USE)
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def check_network(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP320 and SBP321 over rules and tool blocks, SBP322 over `defaults`."""
    for rv in rule_views(view):
        if rv.node.effect != "permit" or not any(k in _NET for k in rv.capabilities):
            continue
        for value in rv.resources("schemes"):
            if isinstance(value, ast.Str) and value.value.lower() == "http":
                yield finding("SBP320", f"{where(rv)} permits plain `http`", value.span,
                              rv.anchor)
        if CapabilityKind.NET_HTTP not in rv.capabilities:
            continue
        methods = rv.resource("methods")
        writes = sorted({v.value.upper() for v in rv.resources("methods")
                         if isinstance(v, ast.Str)} & WRITE_METHODS)
        anywhere = [v for v, h in host_patterns(rv) if is_any_host(h)]
        if methods is not None and writes and anywhere:
            yield finding("SBP321", f"{where(rv)} permits {', '.join(writes)} to any host "
                          f"(`{anywhere[0].value}`)", methods.span, rv.anchor)
    for item in view.file.items:
        if isinstance(item, ast.Defaults):
            for setting in item.settings:
                value = setting.value
                if setting.key == "network" and isinstance(value, ast.Word) \
                        and value.value == "on":
                    yield finding("SBP322", "`defaults` turn the network `on` for every "
                                  "sandboxed process", setting.span, item.span)


CHECKS = (check_network,)
