"""JSON output (format 1): every finding, suppressed ones included with their reason.

Shape (stable; fields are only ever added)::

    {"version": 1, "files": [...], "unusable": [...],
     "summary": {"error": n, "warning": n, "note": n, "suppressed": n},
     "findings": [{"id", "name", "severity", "message", "help", "file", "line", "column",
                   "end_line", "end_column", "suppressed", "reason", "fingerprint"}]}
"""

from __future__ import annotations

import json
from typing import Any

from policy_engine.errors import Severity
from policy_engine.lint.model import Finding, LintResult
from policy_engine.lint.registry import RULES

FORMAT_VERSION = 1


def source_line(result: LintResult, f: Finding) -> str:
    span = f.span
    if span is None or span.line < 1:
        return ""
    lines = result.sources.get(span.file, "").split("\n")
    return lines[span.line - 1] if span.line <= len(lines) else ""


def finding_json(result: LintResult, f: Finding) -> dict[str, Any]:
    doc = f.diagnostic.to_json()
    spec = RULES.get(f.id)
    doc = {"id": doc.pop("id"), "name": spec.name if spec else None, **doc}
    doc["suppressed"] = f.suppressed is not None
    doc["reason"] = f.suppressed
    doc["fingerprint"] = f.fingerprint(source_line(result, f))
    return doc


def render_json(result: LintResult) -> str:
    active = result.active()
    summary: dict[str, int] = {s.value: sum(1 for f in active if f.severity is s)
                               for s in Severity}
    summary["suppressed"] = len(result.findings) - len(active)
    doc = {
        "version": FORMAT_VERSION,
        "files": result.files,
        "unusable": result.unusable,
        "summary": summary,
        "findings": [finding_json(result, f) for f in result.findings],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
