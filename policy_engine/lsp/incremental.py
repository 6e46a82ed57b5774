"""Incremental diagnostics for a large buffer between two full analyses: re-parse only the
top-level statements whose text changed, and carry the last full analysis's findings over for
the statements that did not (moved to their new lines).

A buffer is cut into statements at lines that start, unindented and outside any `{ }` block,
with a keyword that begins one (`policy`, `import`, `defaults`, `permit`, `forbid`, `require`,
`profile`, `tool`). Each changed statement is parsed alone, which finds its syntax errors
(SBP1xx: they are local to it). What needs the whole policy — checks across rules, imports,
lint — comes from the full analysis the scheduler runs when the typing stops.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from policy_engine.dsl.fastparse import parse
from policy_engine.errors import Diagnostic, Span

_START = re.compile(r"(?:policy|import|defaults|permit|forbid|require|profile|tool)\b")
# what cannot hold a brace that counts: strings, CEL, regexes and comments (one line each;
# a CEL condition spanning lines is rare, and the full analysis corrects any miscount)
_OPAQUE = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`\n]*`|/(?:[^/\\\n]|\\.)+/|(?:#|//)[^\n]*')


@dataclass(frozen=True, slots=True)
class Chunk:
    """One top-level statement (with the comments and blank lines before it)."""

    start: int  # 1-based line of its first row
    text: str

    @property
    def rows(self) -> int:
        return self.text.count("\n") + (0 if self.text.endswith("\n") else 1)


def chunks(text: str) -> list[Chunk]:
    """``text`` cut at its top-level statements; joining the texts gives ``text`` back."""
    rows = text.split("\n")
    starts = [0]
    depth = 0
    for i, row in enumerate(rows):
        if i > 0 and depth == 0 and _START.match(row):
            starts.append(i)
        stripped = _OPAQUE.sub("", row)
        depth = max(depth + stripped.count("{") - stripped.count("}"), 0)
    out = []
    for n, first in enumerate(starts):
        last = starts[n + 1] if n + 1 < len(starts) else len(rows)
        body = "\n".join(rows[first:last])
        out.append(Chunk(first + 1, body + ("\n" if last < len(rows) else "")))
    return out


def _shift(span: Span | None, by: int) -> Span | None:
    if span is None or by == 0:
        return span
    return replace(span, line=span.line + by,
                   end_line=span.end_line + by if span.end_line is not None else None)


def _moved(diag: Diagnostic, by: int) -> Diagnostic:
    return replace(diag, span=_shift(diag.span, by)) if by else diag


@dataclass(slots=True)
class Snapshot:
    """A full analysis: the statements it saw and what it found, per statement."""

    chunks: list[Chunk]
    found: list[list[Diagnostic]]  # by statement index
    loose: list[Diagnostic] = field(default_factory=list)  # no line, or another file's

    @classmethod
    def of(cls, text: str, path: str, diagnostics: Sequence[Diagnostic]) -> Snapshot:
        parts = chunks(text)
        found: list[list[Diagnostic]] = [[] for _ in parts]
        loose: list[Diagnostic] = []
        for d in diagnostics:
            span = d.span
            if span is None or span.file != path:
                loose.append(d)
                continue
            index = next((i for i in range(len(parts) - 1, -1, -1)
                          if parts[i].start <= span.line), 0)
            found[index].append(d)
        if not any(d.id.startswith("SBP1") for d in diagnostics):
            for part in parts:  # the whole parsed: no statement of it has a syntax error
                _remember(path, part.text, [])
        return cls(parts, found, loose)


_parsed: dict[tuple[str, str], list[Diagnostic]] = {}  # (path, statement) → syntax errors
_MAX_PARSED = 20_000  # statements; a 1,000-rule buffer and its edits fit


def _remember(path: str, text: str, found: list[Diagnostic]) -> None:
    if len(_parsed) >= _MAX_PARSED:
        _parsed.clear()
    _parsed[(path, text)] = found


def _syntax(text: str, path: str) -> list[Diagnostic]:
    hit = _parsed.get((path, text))
    if hit is None:
        hit = [d for d in parse(text, path)[1] if d.id.startswith("SBP1")]
        _remember(path, text, hit)
    return hit


def diagnostics(text: str, path: str, last: Snapshot | None) -> list[Diagnostic]:
    """What to show for ``text`` now: each statement's syntax errors (changed statements
    parsed again, alone), plus ``last``'s findings for the statements it already analysed
    unchanged, at their new lines. A statement with a syntax error shows only that."""
    earlier: dict[str, list[int]] = {}
    if last is not None:
        for i, c in enumerate(last.chunks):
            earlier.setdefault(c.text, []).append(i)
    out: list[Diagnostic] = list(last.loose) if last is not None else []
    for chunk in chunks(text):
        syntax = _syntax(chunk.text, path)
        if syntax:
            out.extend(_moved(d, chunk.start - 1) for d in syntax)
            continue
        same = earlier.get(chunk.text)
        if same and last is not None:
            i = same.pop(0)
            out.extend(_moved(d, chunk.start - last.chunks[i].start) for d in last.found[i])
    return out
