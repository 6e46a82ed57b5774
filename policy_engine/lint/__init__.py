"""`policy-engine lint`: a catalogue of SBP3xx rules over compiled policies, with suppressions
and text, JSON, SARIF and GitHub output."""

from policy_engine.lint.engine import lint_paths
from policy_engine.lint.model import Finding, LintConfig, LintResult
from policy_engine.lint.registry import CATALOGUE, RULES, RuleSpec

__all__ = ["CATALOGUE", "RULES", "Finding", "LintConfig", "LintResult", "RuleSpec", "lint_paths"]
