"""SARIF 2.1.0 output that GitHub code scanning accepts.

Locations are relative to the repository root (the nearest directory above the working
directory holding ``.git``, else the working directory) with ``uriBaseId`` ``%SRCROOT%``;
suppressed findings carry ``suppressions`` (``inSource`` with the reason as justification).
Parse and check diagnostics (SBP1xx/SBP2xx) of unusable inputs are results too, with rules of
their own, so the upload shows why a file could not be linted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from policy_engine import __version__
from policy_engine.errors import DIAGNOSTICS, Severity
from policy_engine.lint.model import Finding, LintResult
from policy_engine.lint.output.docs_url import doc_link, docs_base
from policy_engine.lint.output.json_out import source_line
from policy_engine.lint.registry import CATALOGUE, RULES

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"
FINGERPRINT_KEY = "sbpolicyFinding/v1"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}


def repo_root(start: str | None = None) -> Path:
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d
    return here


def _rule(rule_id: str) -> dict[str, Any]:
    rule = _rule_body(rule_id)
    # only a link to the installed version's own docs (docs_url.py); none rather than a guess
    link = (doc_link("lint-rules.md", rule_id.lower()) if rule_id in RULES
            else doc_link("error-codes.md", "policy-file-diagnostics"))
    if link is not None:
        rule["helpUri"] = link
    return rule


def _rule_body(rule_id: str) -> dict[str, Any]:
    spec = RULES.get(rule_id)
    if spec is not None:
        md = (f"**{spec.title}**\n\n{spec.rationale}\n\n**Fix:** {spec.fix}\n\n"
              f"Triggers:\n\n```\n{spec.bad}```\n\nFixed:\n\n```\n{spec.good}```\n")
        return {
            "id": spec.id, "name": spec.name,
            "shortDescription": {"text": spec.title},
            "fullDescription": {"text": spec.rationale},
            "help": {"text": f"{spec.rationale} Fix: {spec.fix}", "markdown": md},
            "defaultConfiguration": {"level": _LEVEL[spec.severity]},
            "properties": {
                "tags": ["security", spec.category, "sbpolicy"],
                "security-severity": f"{spec.security_severity:.1f}",
                "precision": "high",
                "problem.severity": spec.severity.value if spec.severity is not Severity.NOTE
                else "recommendation",
            },
        }
    diag = DIAGNOSTICS[rule_id]
    return {
        "id": diag.id, "name": diag.title.replace(" ", "-"),
        "shortDescription": {"text": diag.title},
        "fullDescription": {"text": f"{diag.title}: the file cannot be used as a policy"},
        "help": {"text": diag.help},
        "defaultConfiguration": {"level": _LEVEL[diag.severity]},
        "properties": {"tags": ["correctness", "sbpolicy"]},
    }


def _uri(file: str, root: Path) -> str:
    real = Path(os.path.realpath(file))
    try:
        rel = real.relative_to(root).as_posix()
    except ValueError:  # outside the repository: an absolute file URI
        return real.as_uri()
    return quote(rel)


def _result(result: LintResult, f: Finding, index: int, root: Path) -> dict[str, Any]:
    d = f.diagnostic
    text = d.message + (f" (help: {d.help})" if d.help else "")
    out: dict[str, Any] = {
        "ruleId": f.id, "ruleIndex": index, "level": _LEVEL[d.severity],
        "message": {"text": text},
    }
    span = d.span
    if span is not None:
        phys: dict[str, Any] = {"artifactLocation": {"uri": _uri(span.file, root)}}
        if not phys["artifactLocation"]["uri"].startswith("file:"):
            phys["artifactLocation"]["uriBaseId"] = SRCROOT
        if span.line > 0:
            region = {"startLine": span.line, "startColumn": max(1, span.column)}
            if span.end_line is not None and span.end_column is not None:
                region["endLine"] = span.end_line
                region["endColumn"] = max(1, span.end_column)
            phys["region"] = region
        out["locations"] = [{"physicalLocation": phys}]
    out["partialFingerprints"] = {FINGERPRINT_KEY: f.fingerprint(source_line(result, f))}
    if f.suppressed is not None:
        out["suppressions"] = [{"kind": "inSource", "status": "accepted",
                                "justification": f.suppressed}]
    return out


def render_sarif(result: LintResult, *, root: Path | None = None) -> str:
    base = root or repo_root()
    ids = [spec.id for spec in CATALOGUE]
    ids += sorted({f.id for f in result.findings} - set(ids))
    index = {rule_id: i for i, rule_id in enumerate(ids)}
    driver: dict[str, Any] = {"name": "policy-engine", "version": __version__,
                              "semanticVersion": __version__, "rules": [_rule(i) for i in ids]}
    base_docs = docs_base()
    if base_docs is not None:
        driver["informationUri"] = base_docs + "lint-rules.md"
    run = {
        "tool": {"driver": driver},
        "originalUriBaseIds": {SRCROOT: {"uri": base.as_uri() + "/"}},
        "columnKind": "unicodeCodePoints",
        "results": [_result(result, f, index[f.id], base) for f in result.findings],
    }
    doc = {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
