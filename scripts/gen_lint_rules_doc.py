"""Regenerate docs/lint-rules.md from the lint catalogue (tests/unit/test_lint_docs.py checks)."""

from __future__ import annotations

from pathlib import Path

from policy_engine.lint.registry import CATALOGUE

HEADER = """# Lint rules (`policy-engine lint`)

Generated from `policy_engine/lint/registry.py` by `scripts/gen_lint_rules_doc.py`; do not edit.

Severities and exit codes: `error` findings fail the run (exit 1); `warning` findings fail only
with `--deny-warnings`; `note` findings never fail. A file that does not parse or compile is
unusable input (its SBP1xx/SBP2xx diagnostics are reported in the chosen format, exit 2).

Suppress a finding with a comment carrying a reason:
`# sbpolicy: ignore SBP301 reason="public docs crawler"` (several IDs: `SBP301,SBP320`). A
comment after code covers its own line; a comment on a line of its own covers the next line
with code, and with it the whole statement (rule, block, import) starting there. The reason is
mandatory (SBP346); unknown IDs (SBP348), unused suppressions (SBP347) and malformed ones
(SBP345) are findings themselves and cannot be suppressed.

"Org default" (SBP331) is the merged `defaults` of the policy being linted: the root file and
everything it imports. A file imported by another linted file is linted within the first
(in path order) policy that imports it.

Where the rules apply. A `tool` block's permits get every rule a top-level permit gets:
SBP300-SBP303, SBP310-SBP313 and SBP320-SBP321 as written, and SBP337-SBP339 within the block
(a permit repeating another, one the policy's unconditional forbids cover, one another permit
of the block already admits: a tool's permissions are a union). Two do not apply, by design:
SBP330, since a tool's timeout is one narrowing layer and the rule fires on the policy rule
that admits the call, and SBP335/SBP336, since tool blocks have no `when`. The capabilities of
JSON/YAML manifests and grants get SBP300-SBP303, SBP310-SBP313 and SBP320-SBP321 at the
value's line and column; JSON has no comments, so a `.sbpolicy-ignore.yaml` beside the
documents suppresses their findings (`- {file: NAME, at: permissions[N], ignore: [IDS],
reason: "..."}`, `at` optional, the same rules as comments). Requests,
settings, engine configs and `*.sbtest.yaml` files are checked as the engine loads them
(SBP105 at the field), with no SBP3xx rules.

| id | name | category | severity | title |
|---|---|---|---|---|
"""


def render() -> str:
    rows = [f"| [`{r.id}`](#{r.id.lower()}) | `{r.name}` | {r.category} | {r.severity.value} "
            f"| {r.title} |" for r in CATALOGUE]
    sections = []
    for r in CATALOGUE:
        sections.append(
            f"## {r.id}\n\n**{r.name}** — {r.title}. Category: {r.category}; severity: "
            f"{r.severity.value}; security-severity {r.security_severity:.1f}.\n\n"
            f"{r.rationale}\n\n**Fix:** {r.fix}\n\nTriggers it:\n\n```sbpolicy\n{r.bad}```\n\n"
            f"Fixed:\n\n```sbpolicy\n{r.good}```\n")
    return HEADER + "\n".join(rows) + "\n\n" + "\n".join(sections)


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "lint-rules.md"
    out.write_text(render(), encoding="utf-8")
    print(f"wrote {out}")
