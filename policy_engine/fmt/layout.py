"""Output lines of the formatter, literal spelling (strings, regexes, CEL) and the final text."""

from __future__ import annotations

import re
from dataclasses import dataclass

from policy_engine.dsl import ast

WIDTH = 100
"""The column limit the layout aims for (a line longer than this only when it cannot break)."""
INDENT = 2
SEP = "  "
"""Between the clauses of a rule on one line, and between the entries of an inline block."""
CEL_SPACE = " \t\n\r\f\v"
"""Whitespace around a CEL expression (CEL's own whitespace set)."""


@dataclass(slots=True)
class Line:
    """One output line: code at an indent, and an optional comment after it.

    ``code`` is empty for a comment on its own line. It holds newlines only for a multi-line
    CEL condition, whose continuation lines carry their own indentation.
    """

    indent: int
    code: str
    comment: str | None = None


BLANK = None
"""A blank line in a list of output lines."""

Lines = list[Line | None]


def attach(lines: Lines, comment: ast.Comment) -> None:
    """Put ``comment`` after the last line's code, or on its own line if that one has one."""
    last = next((ln for ln in reversed(lines) if ln is not None), None)
    if last is None:
        lines.append(Line(0, "", text_of(comment)))
    elif last.comment is None and last.code:
        last.comment = text_of(comment)
    else:
        lines.append(Line(last.indent, "", text_of(comment)))


def own(comment: ast.Comment, indent: int) -> Line:
    return Line(indent, "", text_of(comment))


def text_of(comment: ast.Comment) -> str:
    """A comment as printed: as written, without trailing whitespace."""
    return comment.text.rstrip()


# ---- literals -------------------------------------------------------------------------------

_NAMED = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}
# Invisible or line-breaking characters are written as \uXXXX so a reader sees them (the
# bidirectional controls are the "trojan source" characters).
_INVISIBLE = ("\x00-\x1f\x7f-\x9f\u200b\u200e\u200f\u2028\u2029\u202a-\u202e"
              "\u2066-\u2069\ufeff")
_ESCAPED = re.compile(f'[\\\\"{_INVISIBLE}]')


def quote(value: str) -> str:
    """The canonical string literal for ``value``: the same value, one spelling."""
    if _ESCAPED.search(value) is None:
        return f'"{value}"'
    return '"' + _ESCAPED.sub(_escape, value) + '"'


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    return _NAMED.get(ch) or f"\\u{ord(ch):04x}"


def regex(body: str) -> str:
    """A regex alternative as written: the AST keeps it with ``\\/`` unescaped."""
    return "/" + body.replace("/", "\\/") + "/"


def value(v: ast.Value) -> str:
    if isinstance(v, ast.Str):
        return quote(v.value)
    if isinstance(v, ast.Word):
        return v.value
    return v.text


def cel(node: ast.Cel, column: int) -> str:
    """The condition between backticks, with the opening backtick printed at ``column``.

    The expression is kept as written, except: surrounding whitespace is dropped, and the lines
    of a multi-line condition are shifted by how far its first character moved, so that an
    aligned continuation stays aligned. The shift is skipped when it cannot be done by adding or
    removing spaces only, or when the text has a triple-quoted string (whose content would move).
    """
    source = node.source
    if "\n" not in source:
        return "`" + source.strip(CEL_SPACE) + "`"
    raw = source.split("\n")
    first = next((i for i, ln in enumerate(raw) if ln.strip(CEL_SPACE)), None)
    if first is None:
        return "``"
    lead = len(raw[first]) - len(raw[first].lstrip(CEL_SPACE))
    old = (node.span.column + 1 + lead) if first == 0 else (1 + lead)
    body = [ln.rstrip("\r") for ln in raw[first:]]
    body[0] = body[0].lstrip(CEL_SPACE)
    while len(body) > 1 and not body[-1].strip(CEL_SPACE):
        body.pop()
    if len(body) == 1:
        return "`" + body[0].rstrip(CEL_SPACE) + "`"
    shifted = _shift(body[1:], column + 1 - old, source)
    if shifted is not None:
        body = [body[0].rstrip(CEL_SPACE), *shifted]
    else:
        body[-1] = body[-1].rstrip(CEL_SPACE)
    return "`" + "\n".join(body) + "`"


def _shift(lines: list[str], delta: int, source: str) -> list[str] | None:
    if '"""' in source or "'''" in source:
        return None
    out: list[str] = []
    for ln in lines:
        text = ln.rstrip(CEL_SPACE)
        if not text:
            out.append("")
            continue
        lead = len(text) - len(text.lstrip(" "))
        if text[lead] in CEL_SPACE or (delta < 0 and lead < -delta):
            return None  # a tab or form feed in the indentation, or not enough to remove
        out.append(" " * (lead + delta) + text[lead:])
    return out


def cel_key(source: str) -> str:
    """What a condition means, for the soundness check: the text with each line's surrounding
    whitespace and blank lines ignored — exactly what :func:`cel` may change — unless the text
    has a triple-quoted string, where every character counts."""
    if '"""' in source or "'''" in source:
        return source.strip(CEL_SPACE)
    return "\n".join(s for ln in source.split("\n") if (s := ln.strip(CEL_SPACE)))


# ---- final text -----------------------------------------------------------------------------

def render(lines: Lines) -> str:
    """Join lines; trailing comments of consecutive lines at one indent share a column."""
    column: dict[int, int] = {}
    run: list[int] = []

    def close() -> None:
        if run:
            width = max(_width(lines[i]) for i in run)
            for i in run:
                column[i] = width + len(SEP)
            run.clear()

    for i, ln in enumerate(lines):
        alignable = (ln is not None and ln.code and ln.comment is not None
                     and "\n" not in ln.code)
        if not alignable or (run and _indent(lines[run[-1]]) != _indent(ln)):
            close()
        if alignable:
            run.append(i)
    close()
    out: list[str] = []
    for i, ln in enumerate(lines):
        if ln is None:
            out.append("")
            continue
        text = " " * ln.indent + ln.code
        if ln.comment is not None:
            if not ln.code:
                text += ln.comment
            elif i in column:
                text += " " * (column[i] - _width(ln)) + ln.comment
            else:
                text += SEP + ln.comment
        out.append(text)
    return "\n".join(out) + "\n" if out else ""


def _width(ln: Line | None) -> int:
    return 0 if ln is None else ln.indent + len(ln.code)


def _indent(ln: Line | None) -> int:
    return -1 if ln is None else ln.indent
