"""The error registry: ten stable codes, their statuses, and docs that never drift from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_engine.errors import (
    DIAGNOSTICS,
    REGISTRY,
    Diagnostic,
    DiagnosticsError,
    ErrorCode,
    PolicyEngineError,
    Severity,
    Span,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "error-codes.md"

EXPECTED = {
    "SANDBOX.PERMISSION_DENY": 403,
    "POLICY.DENY_TOOL": 403,
    "SANDBOX.CAPABILITY_BLOCKED": 403,
    "PROVIDER.UNAVAILABLE": 503,
    "LLM.TIMEOUT": 504,
    "QUOTA.BUDGET_EXCEEDED": 429,
    "SCHEMA.VALIDATION_FAILED": 422,
    "TOOL.EXECUTION_FAILED": 500,
    "TOOL.NOT_FOUND": 404,
    "UNKNOWN.INTERNAL": 500,
}


def test_registry_holds_exactly_the_stable_codes_with_their_statuses() -> None:
    assert {c.value: s.http_status for c, s in REGISTRY.items()} == EXPECTED


def test_retryable_only_for_transient_failures() -> None:
    retryable = {c.value for c, s in REGISTRY.items() if s.retryable}
    assert retryable == {"PROVIDER.UNAVAILABLE", "LLM.TIMEOUT", "TOOL.EXECUTION_FAILED"}


def test_public_view_fills_template_and_keeps_audit_out() -> None:
    err = PolicyEngineError(
        ErrorCode.CAPABILITY_BLOCKED, "path `/etc/shadow` is denied", audit={"secret": "s3cr3t"}
    )
    view = err.public_view()
    assert view == {
        "code": "SANDBOX.CAPABILITY_BLOCKED",
        "http_status": 403,
        "retryable": False,
        "message": "blocked by sandbox policy: path `/etc/shadow` is denied",
    }
    assert "s3cr3t" not in str(view)


def test_unknown_internal_public_message_reveals_nothing() -> None:
    err = PolicyEngineError(ErrorCode.UNKNOWN_INTERNAL, "KeyError: 'api_key=abc'")
    assert err.public_message() == "internal error"


def test_diagnostic_ids_are_in_their_families() -> None:
    for diag_id, spec in DIAGNOSTICS.items():
        assert diag_id[:4] in ("SBP1", "SBP2", "SBP3", "SBP4")
        assert spec.help
        assert not spec.title.endswith(".")


def test_diagnostic_make_takes_registry_severity_and_help() -> None:
    d = Diagnostic.make("SBP216", "rule `x` can never match", Span("a.sbpolicy", 3, 1))
    assert d.severity is Severity.WARNING
    assert d.help == DIAGNOSTICS["SBP216"].help
    assert d.to_json()["line"] == 3
    assert str(DiagnosticsError([d])).startswith("a.sbpolicy:3:1: SBP216")


@pytest.mark.parametrize("code", list(REGISTRY))
def test_docs_list_every_code_with_its_status(code: ErrorCode) -> None:
    text = DOCS.read_text()
    spec = REGISTRY[code]
    assert f"| `{code.value}` | {spec.http_status} |" in text


def test_docs_list_every_diagnostic() -> None:
    text = DOCS.read_text()
    missing = [d for d in DIAGNOSTICS if f"| `{d}` |" not in text]
    assert missing == []
