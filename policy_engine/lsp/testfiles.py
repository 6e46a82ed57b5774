"""Go to definition from a `*.sbtest.yaml` policy test: its policy files and `want_rule` ids."""

from __future__ import annotations

import os
import re

from policy_engine.dsl import ast
from policy_engine.dsl.fastparse import parse_file
from policy_engine.errors import Span

_POLICY = re.compile(r"^policy:\s*(.+?)\s*(?:#.*)?$", re.MULTILINE)
_PATH = re.compile(r"""["']?([^"',\[\]\s]+\.sbpolicy)["']?""")
_WANT_RULE = re.compile(r"^\s*(?:-\s*)?want_rule:\s*[\"']?([^\"'#\s]+)")


def policy_paths(text: str, path: str) -> list[str]:
    """The policy files a test file names (`policy: a.sbpolicy` or a list), made absolute."""
    match = _POLICY.search(text)
    if match is None:
        return []
    base = os.path.dirname(path)
    return [os.path.join(base, p) for p in _PATH.findall(match.group(1))]


def _rules(pf: ast.PolicyFile) -> list[ast.Rule]:
    out: list[ast.Rule] = []
    for item in pf.items:
        if isinstance(item, ast.Rule):
            out.append(item)
        elif isinstance(item, ast.ToolDef):
            out.extend(item.permits)
    return out


def _find_rule(rule_id: str, roots: list[str]) -> Span | None:
    """The rule named ``rule_id`` in ``roots`` or the files they import (breadth first)."""
    queue, seen = list(roots), set()
    while queue:
        file = queue.pop(0)
        real = os.path.realpath(file)
        if real in seen:
            continue
        seen.add(real)
        pf, _ = parse_file(file)
        if pf is None:
            continue
        for rule in _rules(pf):
            if rule.name is not None and rule.name.value == rule_id:
                return rule.span
        queue.extend(os.path.join(os.path.dirname(file), i.path.value) for i in pf.imports)
    return None


def definition(text: str, path: str, line: int) -> Span | None:
    """On a `policy:` line: the first policy file; on `want_rule: ID`: that rule."""
    rows = text.split("\n")
    if not 1 <= line <= len(rows):
        return None
    row = rows[line - 1]
    policies = policy_paths(text, path)
    if row.startswith("policy:"):
        existing = [p for p in policies if os.path.isfile(p)]
        return Span(existing[0], 1, 1) if existing else None
    match = _WANT_RULE.match(row)
    if match is None or match.group(1) == "null":
        return None
    return _find_rule(match.group(1), policies)
