"""Suppressions for JSON/YAML documents, which have no `# sbpolicy:` comments: a
``.sbpolicy-ignore.yaml`` beside them lists, per file, the IDs to hide and why.

```yaml
- file: fetch-agent.json          # a document in this directory
  at: capabilities[0]             # optional: only findings about that capability
  ignore: [SBP302, SBP320]
  reason: "the example shows the policy narrowing a broad grant"
```

The same rules as comments: the reason is mandatory (SBP346, the entry is not honoured),
unknown or suppression IDs are reported (SBP348), an entry that is not of this shape is
SBP345, one hiding nothing is SBP347; findings about suppressions cannot be suppressed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from policy_engine.errors import Diagnostic, Span
from policy_engine.lint.model import Finding, LintConfig
from policy_engine.lint.registry import RULES, SUPPRESSION_IDS

FILE_NAME = ".sbpolicy-ignore.yaml"
_MAX_BYTES = 256 * 1024  # a hand-written list; anything larger is not one


@dataclass(slots=True)
class Entry:
    file: str
    at: str | None
    ids: tuple[str, ...]
    reason: str
    span: Span
    used: set[str] = field(default_factory=set)


def _entries(path: str) -> tuple[list[Entry], list[Finding]]:
    try:
        if os.path.getsize(path) > _MAX_BYTES:
            raise OSError(f"larger than {_MAX_BYTES} bytes")
        with open(path, encoding="utf-8") as fh:
            node = yaml.compose(fh)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        where = Span(path, 1, 1)
        return [], [Finding(Diagnostic.make("SBP345", f"cannot read `{path}`: "
                                            f"{str(exc).splitlines()[0][:200]}", where), 1)]
    out: list[Entry] = []
    problems: list[Finding] = []
    items = node.value if isinstance(node, yaml.SequenceNode) else None
    if node is not None and items is None:
        return [], [Finding(Diagnostic.make(
            "SBP345", f"`{path}` must be a list of {{file, ignore, reason}} entries",
            Span(path, node.start_mark.line + 1, node.start_mark.column + 1)), 1)]
    for item in items or ():
        span = Span(path, item.start_mark.line + 1, item.start_mark.column + 1)
        data: Any = yaml.safe_load(yaml.serialize(item)) if isinstance(
            item, yaml.MappingNode) else None
        ids = data.get("ignore") if isinstance(data, dict) else None
        if isinstance(ids, str):
            ids = [i.strip() for i in ids.split(",")]
        if (not isinstance(data, dict) or not isinstance(data.get("file"), str)
                or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)
                or not isinstance(data.get("at", ""), str)
                or set(data) - {"file", "at", "ignore", "reason"}):
            problems.append(Finding(Diagnostic.make(
                "SBP345", "a suppression entry is `{file: NAME, ignore: [IDS], reason: \"...\"}` "
                "with an optional `at: capabilities[N]`", span), span.line))
            continue
        wanted = tuple(i.strip().upper() for i in ids)
        known = tuple(i for i in wanted if i in RULES and i not in SUPPRESSION_IDS)
        for unknown in (i for i in wanted if i not in known):
            why = "suppression findings cannot be suppressed" if unknown in SUPPRESSION_IDS \
                else "not a lint rule ID"
            problems.append(Finding(Diagnostic.make(
                "SBP348", f"`{unknown}` in suppression: {why}", span), span.line))
        reason = data.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            problems.append(Finding(Diagnostic.make(
                "SBP346", "suppression of " + ", ".join(wanted) + " has no reason; it is ignored",
                span), span.line))
            continue
        if known:
            out.append(Entry(data["file"], data.get("at") or None, known, reason.strip(), span))
    return out, problems


def _covers(entry: Entry, finding: Finding, document: str) -> bool:
    span = finding.span
    if span is None or span.file != document or finding.id not in entry.ids:
        return False
    message = finding.diagnostic.message
    return entry.at is None or f"{entry.at} of " in message


def apply(findings: list[Finding], documents: list[str], cfg: LintConfig) -> list[Finding]:
    """Mark the findings of ``documents`` that a ``.sbpolicy-ignore.yaml`` beside them covers
    as suppressed, and add the findings about the suppression files. Order is kept."""
    by_dir: dict[str, list[str]] = {}
    for doc in documents:
        by_dir.setdefault(os.path.dirname(doc), []).append(doc)
    extra: list[Finding] = []
    for directory, docs in by_dir.items():
        path = os.path.join(directory, FILE_NAME)
        if not os.path.isfile(path):
            continue
        entries, problems = _entries(path)
        extra.extend(problems)
        names = {os.path.basename(d): d for d in docs}
        for i, f in enumerate(findings):
            if f.suppressed is not None or f.id in SUPPRESSION_IDS:
                continue
            hit = next((e for e in entries if e.file in names
                        and _covers(e, f, names[e.file])), None)
            if hit is not None:
                hit.used.add(f.id)
                findings[i] = replace(f, suppressed=hit.reason)
        for e in entries:
            if e.file not in names:  # that document was not linted this time
                continue
            for rule_id in e.ids:
                if rule_id not in e.used and cfg.enabled(rule_id):
                    extra.append(Finding(Diagnostic.make(
                        "SBP347", f"suppression of `{rule_id}` in `{e.file}`"
                        + (f" at {e.at}" if e.at else "") + " matches no finding", e.span),
                        e.span.line))
    return findings + extra
