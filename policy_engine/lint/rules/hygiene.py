"""Rules SBP340-SBP341: imports that add nothing, profiles nothing refers to."""

from __future__ import annotations

import os
from collections.abc import Iterator

from policy_engine.compiler.builtins import BUILTIN_PROFILES
from policy_engine.dsl import ast
from policy_engine.lint.model import FileView, Finding, LintConfig
from policy_engine.lint.rules.base import finding

_CONTENT = (ast.Defaults, ast.Rule, ast.Consent, ast.ProfileDef, ast.ToolDef)


def check_imports(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP340: the same file imported twice, or a file with nothing but a header and imports
    (whose own imports add nothing either)."""
    units = {os.path.realpath(u.file.file): u.file for u in view.policy.units}
    by_display = {u.file.file: u.file for u in view.policy.units}
    here = os.path.dirname(view.real)
    seen: dict[str, ast.Import] = {}
    for imp in view.file.imports:
        if not imp.path.value:
            continue
        real = os.path.realpath(os.path.join(here, imp.path.value))
        if real in seen:
            yield finding("SBP340", f"`{imp.path.value}` is already imported at line "
                          f"{seen[real].span.line}", imp.path.span, imp.span)
            continue
        seen[real] = imp
        shown = os.path.normpath(os.path.join(os.path.dirname(view.name), imp.path.value))
        target = by_display.get(shown) or units.get(real)
        if target is not None and not _contributes(target, by_display, set()):
            yield finding("SBP340", f"`{imp.path.value}` defines no rules, defaults, consent, "
                          "profiles or tools", imp.path.span, imp.span)


def _contributes(pf: ast.PolicyFile, files: dict[str, ast.PolicyFile], seen: set[str]) -> bool:
    if any(isinstance(i, _CONTENT) for i in pf.items):
        return True
    seen.add(pf.file)
    for imp in pf.imports:
        shown = os.path.normpath(os.path.join(os.path.dirname(pf.file), imp.path.value))
        child = files.get(shown)
        if child is not None and shown not in seen and _contributes(child, files, seen):
            return True
    return False


def check_profiles_used(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP341 (note): a policy-defined, non-seed profile that no tool block names."""
    used = {s.value.value for u in view.policy.units for i in u.file.items
            if isinstance(i, ast.ToolDef) for s in i.settings
            if isinstance(s, ast.Setting) and s.key == "profile" and isinstance(s.value, ast.Str)}
    for item in view.file.items:
        if isinstance(item, ast.ProfileDef) and item.name.value not in BUILTIN_PROFILES \
                and item.name.value not in used:
            yield finding("SBP341", f"profile `{item.name.value}` is not referenced by any tool "
                          "block (grants and operator settings may still select it)",
                          item.name.span, item.span)


CHECKS = (check_imports, check_profiles_used)
