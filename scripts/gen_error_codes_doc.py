"""Regenerate docs/error-codes.md from the error registry (tests/unit/test_errors.py checks it)."""

from __future__ import annotations

from pathlib import Path

from policy_engine.errors import DIAGNOSTICS, REGISTRY

HEADER = """# Error codes and diagnostics

Every refusal or failure carries exactly one stable code from one registry
(`policy_engine/errors.py`). The strings are a public contract: codes are only ever added.
The public view shows the message template filled with a redacted reason; the audit view
(evidence, logs) keeps the detail listed below — never secrets or raw content.

## Runtime error codes

| code | HTTP | retryable | when | public message | audit detail |
|---|---|---|---|---|---|
"""

DIAG_HEADER = """
## Policy-file diagnostics

`SBP1xx` are parse errors, `SBP2xx` check errors and warnings, `SBP3xx` lint findings
(catalogue with examples: [lint-rules.md](lint-rules.md)), `SBP40x`–`SBP41x` policy-test file
problems (`policy-engine test`) and `SBP42x` formatter failures (`policy-engine fmt`).
Every command prints each as `file:line:col: SBPnnn message`, the source line, a caret
under the column and a `help:` line.

| id | severity | title | help |
|---|---|---|---|
"""


def render() -> str:
    rows = [
        f"| `{s.code.value}` | {s.http_status} | {'yes' if s.retryable else 'no'} | {s.when} "
        f"| `{s.public_message}` | {s.audit_detail} |"
        for s in REGISTRY.values()
    ]
    diags = [
        f"| `{d.id}` | {d.severity.value} | {d.title} | {d.help} |" for d in DIAGNOSTICS.values()
    ]
    return HEADER + "\n".join(rows) + "\n" + DIAG_HEADER + "\n".join(diags) + "\n"


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "error-codes.md"
    out.write_text(render())
    print(f"wrote {out}")
