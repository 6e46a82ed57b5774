"""Inline suppressions: `# sbpolicy: ignore SBP301[,SBP320] reason="..."`, and their own findings.

Where a suppression applies: a comment after code on a line covers findings on that line; a
comment on a line of its own covers the next line that holds code (so several suppression
comments may be stacked above a statement). A finding is covered when it starts on that line or
lies in a statement (rule, block, import) that starts on it. The reason is mandatory: a
suppression without one is reported (SBP346) and not honoured. Unknown IDs (SBP348) and
suppressions that hide nothing (SBP347) are reported too; suppression findings themselves
cannot be suppressed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from policy_engine.dsl import ast
from policy_engine.errors import Diagnostic
from policy_engine.lint.model import Finding, LintConfig
from policy_engine.lint.registry import RULES, SUPPRESSION_IDS

_MARKER = re.compile(r"^(?:#|//)\s*sbpolicy\s*:\s*(?P<body>.*)$")
_BODY = re.compile(
    r'^ignore\s+(?P<ids>[A-Za-z0-9]+(?:\s*,\s*[A-Za-z0-9]+)*)'
    r'(?:\s+reason\s*=\s*"(?P<reason>(?:[^"\\]|\\.)*)")?\s*$')


@dataclass(slots=True)
class Suppression:
    comment: ast.Comment
    ids: tuple[str, ...]
    reason: str | None
    target: int
    used: set[str] = field(default_factory=set)


def _target_line(comment: ast.Comment, lines: list[str]) -> int:
    line = comment.span.line
    before = lines[line - 1][: comment.span.column - 1] if line <= len(lines) else ""
    if before.strip():
        return line  # a trailing comment covers its own line
    for n in range(line + 1, len(lines) + 1):
        text = lines[n - 1].strip()
        if text and not text.startswith(("#", "//")):
            return n
    return line


def parse_suppressions(pf: ast.PolicyFile) -> tuple[list[Suppression], list[Finding]]:
    """The well-formed suppressions of a file, and SBP345/346/348 findings about the rest."""
    lines = pf.source.split("\n")
    out: list[Suppression] = []
    problems: list[Finding] = []
    for comment in pf.comments:
        m = _MARKER.match(comment.text.strip())
        if m is None:
            continue
        line = comment.span.line
        body = _BODY.match(m.group("body").strip())
        if body is None:
            problems.append(Finding(Diagnostic.make(
                "SBP345", f"cannot read suppression `{comment.text.strip()}`", comment.span),
                line))
            continue
        ids = tuple(i.strip().upper() for i in body.group("ids").split(","))
        reason = body.group("reason")
        known = tuple(i for i in ids if i in RULES and i not in SUPPRESSION_IDS)
        for unknown in (i for i in ids if i not in known):
            why = "suppression findings cannot be suppressed" if unknown in SUPPRESSION_IDS \
                else "not a lint rule ID"
            problems.append(Finding(Diagnostic.make(
                "SBP348", f"`{unknown}` in suppression: {why}", comment.span), line))
        if reason is None or not reason.strip():
            problems.append(Finding(Diagnostic.make(
                "SBP346", "suppression of " + ", ".join(ids) + " has no reason; it is ignored",
                comment.span), line))
            continue
        if known:
            out.append(Suppression(comment, known, reason.strip(), _target_line(comment, lines)))
    return out, problems


def apply(pf: ast.PolicyFile, findings: list[Finding], cfg: LintConfig) -> list[Finding]:
    """Mark covered findings suppressed; add the suppression findings. Order is kept."""
    sups, problems = parse_suppressions(pf)
    out: list[Finding] = []
    for f in findings:
        span = f.span
        hit = None
        if f.id not in SUPPRESSION_IDS and span is not None:
            hit = next((s for s in sups if f.id in s.ids
                        and s.target in (span.line, f.anchor_line)), None)
        if hit is not None:
            hit.used.add(f.id)
            f = replace(f, suppressed=hit.reason)
        out.append(f)
    for s in sups:
        for rule_id in s.ids:
            if rule_id not in s.used and cfg.enabled(rule_id):
                problems.append(Finding(Diagnostic.make(
                    "SBP347", f"suppression of `{rule_id}` matches no finding on line "
                    f"{s.target}", s.comment.span), s.comment.span.line))
    return out + problems
