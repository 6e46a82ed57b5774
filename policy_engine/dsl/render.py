"""Render a Diagnostic as text: `file:line:col: SBPnnn message`, the source line, a caret, help."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from policy_engine.errors import Diagnostic, Severity
from policy_engine.inputs.inputfile import read_limited

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_COLORS = {Severity.ERROR: "\x1b[31m", Severity.WARNING: "\x1b[33m", Severity.NOTE: "\x1b[36m"}
_CYAN = "\x1b[36m"
_MAX_CARETS = 80
# A one-line 4 MB file would otherwise be printed whole: show a window around the column.
_MAX_SHOWN = 120
_CONTEXT = 40
# Files over this are not read back for a snippet (the diagnostic may be that they are too big).
_MAX_SNIPPET_FILE = 8 * 1024 * 1024


def render_diagnostic(d: Diagnostic, *, color: bool = False, source: str | None = None) -> str:
    """The diagnostic as lines of text (no trailing newline).

    :param color: wrap the ID, the caret and ``help:`` in ANSI colours.
    :param source: the text of ``d.span.file`` if the caller has it; otherwise the file is read
        (and silently not shown if it cannot be).
    """
    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    sev_color = _COLORS.get(d.severity, "")
    where = ""
    if d.span is not None:
        where = f"{d.span.file}:{d.span.line}:{d.span.column}: " if d.span.line > 0 \
            else f"{d.span.file}: "
    lines = [f"{paint(where, _BOLD) if where else ''}{paint(d.id, _BOLD + sev_color)} {d.message}"]
    snippet = _snippet(d, source)
    if snippet is not None:
        text, caret = snippet
        lines.append(text)
        lines.append(paint(caret, sev_color))
    if d.help:
        lines.append(f"  {paint('help:', _CYAN)} {d.help}")
    lines.extend(f"  note: {n}" for n in d.notes)
    return "\n".join(lines)


def render_diagnostics(diags: list[Diagnostic], *, color: bool = False) -> str:
    """Several diagnostics separated by blank lines."""
    return "\n\n".join(render_diagnostic(d, color=color) for d in diags)


def _snippet(d: Diagnostic, source: str | None) -> tuple[str, str] | None:
    span = d.span
    if span is None or span.line < 1:
        return None
    text = source if source is not None else _read(span.file)
    if text is None:
        return None
    all_lines = text.split("\n")
    if span.line > len(all_lines):
        return None
    line = all_lines[span.line - 1].rstrip("\r")
    col = max(1, min(span.column, len(line) + 1))
    shift = 0
    if len(line) > _MAX_SHOWN:
        start = max(0, col - 1 - _CONTEXT)
        window = line[start:start + _MAX_SHOWN]
        prefix = "..." if start else ""
        suffix = "..." if start + _MAX_SHOWN < len(line) else ""
        shift = start - len(prefix)
        line, col = prefix + window + suffix, col - shift
    width = 1
    end = None if span.end_column is None else span.end_column - shift
    if span.end_line == span.line and end is not None and end > col:
        width = min(end - col, _MAX_CARETS, len(line) + 1 - col)
    # keep tabs so the caret lines up under the same character in any terminal
    pad = "".join("\t" if ch == "\t" else " " for ch in line[:col - 1])
    return line, pad + "^" * width


@lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int) -> str | None:
    try:  # a bounded read of a regular file: the diagnostic may be about a device or a pipe
        data = read_limited(path, _MAX_SNIPPET_FILE)
    except (OSError, ValueError):
        return None
    if len(data) > _MAX_SNIPPET_FILE:
        return None
    return data.decode("utf-8", errors="replace")


def _read(path: str) -> str | None:
    try:
        stat = Path(path).stat()
    except (OSError, ValueError):
        return None
    if stat.st_size > _MAX_SNIPPET_FILE:
        return None
    mtime = stat.st_mtime_ns
    return _read_cached(path, mtime)
