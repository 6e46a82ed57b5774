"""The benchmark corpus generator: deterministic, realistic, compiles clean, and its tests pass."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from policy_engine.compiler import check_files, compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.errors import Severity
from policy_engine.explain.pipeline import explain
from policy_engine.explain.request import ExplainRequest

ROOT = Path(__file__).resolve().parents[2]
FILES = 20


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_policy_corpus", ROOT / "benchmarks" / "gen_policy_corpus.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    GEN.generate(out, FILES, 7)
    return out


def _snapshot(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def test_same_seed_same_bytes_and_a_prefix_of_a_bigger_corpus(corpus: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    GEN.generate(again, FILES, 7)
    assert _snapshot(again) == _snapshot(corpus)
    bigger = tmp_path / "bigger"
    GEN.generate(bigger, FILES + 5, 7)
    big = _snapshot(bigger)
    assert all(big[name] == data for name, data in _snapshot(corpus).items())
    other = tmp_path / "other"
    GEN.generate(other, FILES, 8)
    assert _snapshot(other) != _snapshot(corpus)


def test_layout_and_size(corpus: Path) -> None:
    policies = sorted((corpus / "policies").glob("*.sbpolicy"))
    tests = sorted((corpus / "policies").glob("*.sbtest.yaml"))
    assert len(policies) == FILES
    assert len(tests) == FILES
    lines = [p.read_text().count("\n") for p in policies]
    assert 85 <= sum(lines) / len(lines) <= 120  # ~100 lines each: 1,000 files ~ 100k lines
    assert len(set(p.read_text() for p in policies)) == FILES


def test_policies_use_every_construct(corpus: Path) -> None:
    text = "\n".join(p.read_text() for p in (corpus / "policies").glob("*.sbpolicy"))
    for kind in ("fs.read", "fs.write", "fs.list", "net.http", "browser.use", "proc.exec",
                 "tmp.use", "sys.gpu"):
        assert f" {kind}" in text, kind
    for construct in ("import ", "defaults {", "forbid mandatory", " when `", "require consent",
                      "profile \"", "tool \"", " args [", "limits {", "# "):
        assert construct in text, construct


def test_every_file_compiles_without_errors_or_warnings(corpus: Path) -> None:
    files = sorted((corpus / "policies").glob("*.sbpolicy")) + sorted(
        (corpus / "shared").glob("*.sbpolicy"))
    for path in files:
        diags = check_files([path])
        assert [d for d in diags if d.severity in (Severity.ERROR, Severity.WARNING)] == [], path


def _cases(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc, doc["cases"]


def test_every_generated_case_passes_with_the_real_explain(corpus: Path) -> None:
    fixtures = corpus / "fixtures"
    manifest = load_manifest(fixtures / "bench-agent.json")
    grant = load_grant(fixtures / "bench-grant.json")
    checked = 0
    for test_file in sorted((corpus / "policies").glob("*.sbtest.yaml")):
        doc, cases = _cases(test_file)
        assert (test_file.parent / doc["manifest"]).resolve() == (fixtures / "bench-agent.json")
        assert (test_file.parent / doc["grant"]).resolve() == (fixtures / "bench-grant.json")
        policyset = compile_files([test_file.parent / doc["policy"]])
        assert 4 <= len(cases) <= 6
        for case in cases:
            request = ExplainRequest(op=case["op"], now_ms=doc["now_ms"])
            decision = explain(policyset, manifest, grant, request).decision
            where = f"{test_file.name}: {case['name']}: {decision.reason}"
            assert decision.decision == case["want_decision"], where
            if "want_rule" in case:
                assert decision.rule is not None, where
                assert decision.rule.id == case["want_rule"], where
            checked += 1
    assert checked >= 4 * FILES


def test_the_corpus_is_lint_clean_and_formatted(corpus: Path) -> None:
    from click.testing import CliRunner

    from policy_engine.cli.main import cli

    # the directory walk lints the fixtures too (JSON manifest and grant): the benchmark's
    # `git`/`make` without argument templates are warnings there, and the policies narrow them
    lint = CliRunner().invoke(cli, ["lint", "--deny-warnings", "--ignore", "SBP312",
                                    str(corpus)])
    assert lint.exit_code == 0, lint.output
    assert "bench-agent.json" in CliRunner().invoke(cli, ["lint", str(corpus)]).output
    GEN.format_corpus(corpus)  # the generation step the benchmark runs
    check = CliRunner().invoke(cli, ["fmt", "--check", str(corpus)])
    assert check.exit_code == 0, check.output
    tests = CliRunner().invoke(cli, ["test", str(corpus)])
    assert tests.exit_code == 0, tests.output
