"""docs/lint-rules.md is generated from the catalogue, and the catalogue agrees with errors.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from policy_engine.errors import DIAGNOSTICS
from policy_engine.lint import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_lint_rules_doc.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rules_doc_does_not_drift() -> None:
    render = _generator().render  # type: ignore[attr-defined]
    assert (ROOT / "docs" / "lint-rules.md").read_text(encoding="utf-8") == render(), \
        "run `python3 scripts/gen_lint_rules_doc.py`"


def test_catalogue_matches_the_diagnostic_registry() -> None:
    for rule in CATALOGUE:
        spec = DIAGNOSTICS[rule.id]
        assert (spec.severity, spec.title, spec.help) == (rule.severity, rule.title, rule.fix)
    lint_ids = {i for i in DIAGNOSTICS if re.fullmatch(r"SBP3[0-4]\d", i)}
    assert lint_ids == {r.id for r in CATALOGUE}


def test_catalogue_entries_are_complete() -> None:
    names = [r.name for r in CATALOGUE]
    assert len(set(names)) == len(names)
    for r in CATALOGUE:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", r.name)
        assert r.rationale
        assert r.fix
        assert r.bad
        assert r.good
        assert 0 < r.security_severity <= 10
