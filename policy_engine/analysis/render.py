"""Rendering the exact diff and the analysis: text for terminals, JSON, Markdown for PRs, SARIF."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policy_engine.analysis.difference import Change, Report
from policy_engine.analysis.properties import Answer
from policy_engine.analysis.witness import DEFAULT, Verdict, describe
from policy_engine.graph.policyset import PolicySet


def verdict_text(v: Verdict) -> str:
    text = v.decision + (f" {v.code}" if v.code else "")
    return text + (f" by {v.rule}" if v.rule else " (no rule)")


def change_line(c: Change) -> str:
    where = describe(c.witness.op)
    if c.setting != DEFAULT:
        where += f" [{c.setting.label()}]"
    return where


def summary(report: Report) -> dict[str, Any]:
    return {"changes": len(report.changes),
            "widenings": sum(1 for c in report.changes if c.widening),
            "undecided": len(report.undecided), "exact": report.exact,
            "request_classes": report.cells, "decided_by_both": report.decided}


def _limits(c: Change) -> list[str]:
    return [f"{lc.field}: {lc.old} → {lc.new} ({lc.stricter} is stricter)" for lc in c.limits]


def to_text(report: Report) -> str:
    lines: list[str] = []
    for c in report.changes:
        tag = c.category
        more = f" (+{c.count - 1} more request class(es) alike)" if c.count > 1 else ""
        lines.append(f"{tag}: {change_line(c)}{more}")
        lines.append(f"  before: {verdict_text(c.old)}")
        lines.append(f"  after:  {verdict_text(c.new)}")
        lines += [f"  limit {x}" for x in _limits(c)]
    for u in report.undecided:
        rules = f" ({', '.join(u.rules)})" if u.rules else ""
        lines.append(f"undecided: {u.kind} {u.dimension}{rules}: {u.reason}")
    s = summary(report)
    if not report.cells and report.exact:
        lines.append("the two versions have the same rules, defaults and consent rules")
    lines.append(f"exact diff: {s['changes']} change(s), {s['widenings']} widening, "
                 f"{s['undecided']} undecided, over {s['request_classes']} request class(es) "
                 f"({s['decided_by_both']} decided by both versions)")
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    return {"summary": summary(report), "changes": [c.to_json() for c in report.changes],
            "undecided": [{"kind": u.kind, "dimension": u.dimension, "rules": list(u.rules),
                           "reason": u.reason} for u in report.undecided]}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: Report) -> list[str]:
    s = summary(report)
    lines = [f"**{s['changes']} change(s)**, {s['widenings']} widening, {s['undecided']} "
             f"undecided — exact over {s['request_classes']} request class(es)", ""]
    if report.changes:
        lines += ["| | request (witness, checked under both) | before | after |",
                  "|---|---|---|---|"]
        for c in report.changes:
            after = verdict_text(c.new) + "".join(f"<br>{_cell(x)}" for x in _limits(c))
            lines.append(f"| {'⚠️ widening' if c.widening else c.category} | "
                         f"`{_cell(change_line(c))}` | {_cell(verdict_text(c.old))} | "
                         f"{_cell(after)} |")
    else:
        lines.append("No decision changes." if report.exact else
                     "No decision change found, but not everything was decided (below).")
    if report.undecided:
        lines += ["", "**Not decided exactly:**", ""]
        lines += [f"- {u.kind} {u.dimension} ({', '.join(u.rules) or 'policy'}): "
                  f"{_cell(u.reason)}" for u in report.undecided]
    return lines


# ---- analyze ----------------------------------------------------------------------------------


def answers_text(answers: Sequence[Answer]) -> str:
    lines = []
    for a in answers:
        tag = "UNDECIDED" if a.undecided and a.witness is None else (
            "FINDING" if a.holds else "ok")
        lines.append(f"{tag}: {a.question}? {a.detail}")
        lines += [f"  undecided: {u.kind} {u.dimension}: {u.reason}" for u in a.undecided]
    return "\n".join(lines)


def answers_json(answers: Sequence[Answer]) -> dict[str, Any]:
    return {"findings": sum(1 for a in answers if a.holds),
            "answers": [a.to_json() for a in answers]}


def answers_sarif(answers: Sequence[Answer], ps: PolicySet) -> dict[str, Any]:
    """SARIF 2.1.0: one result per property; a finding is an error located at its rule."""
    by_id = {r.id: r for r in ps.rules}
    results = []
    for a in answers:
        rid = a.verdict.rule_id if a.verdict and a.verdict.rule_id else None
        if a.prop == "rule":
            rid = a.question.split("`")[1]
        rule = by_id.get(rid or "")
        file, line, col = ((rule.ref.file, rule.ref.line, rule.ref.column) if rule
                           else (ps.files[0] if ps.files else "policy", 1, 1))
        results.append({
            "ruleId": a.prop, "level": "error" if a.holds or not a.proven else "note",
            "message": {"text": f"{a.question}? {a.detail}"},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": file},
                                                "region": {"startLine": max(line, 1),
                                                           "startColumn": max(col, 1)}}}]})
    rules = [{"id": p, "shortDescription": {"text": d}} for p, d in PROPERTY_HELP.items()]
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "policy-engine analyze", "rules": rules}},
                      "results": results}]}


PROPERTY_HELP = {
    "read": "a request can read a path matching the given glob",
    "reach": "a request can reach the given host",
    "rule": "a rule is shadowed: taking it out changes no decision",
    "grant": "the grant admits a request manifest ∩ policy denies",
    "shell": "a permit lets a shell or interpreter run any arguments or inline code",
}
