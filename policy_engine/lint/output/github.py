"""GitHub Actions workflow commands: one `::error`/`::warning`/`::notice` line per finding.

Escaping follows the runner (actions/toolkit `command.ts`): in the message `%`, `\\r`, `\\n`;
in property values additionally `:` and `,`.
"""

from __future__ import annotations

from policy_engine.errors import Severity
from policy_engine.lint.model import LintResult

_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(result: LintResult) -> str:
    lines: list[str] = []
    for f in result.active():
        props: list[tuple[str, str]] = []
        span = f.span
        if span is not None and span.line > 0:
            props += [("file", span.file), ("line", str(span.line)), ("col", str(span.column))]
            props += [("endLine", str(span.end_line or span.line))]
            if span.end_column is not None and (span.end_line or span.line) == span.line:
                props.append(("endColumn", str(span.end_column)))
        elif span is not None:
            props.append(("file", span.file))
        props.append(("title", f.id))
        body = f.diagnostic.message + (f"\n{f.diagnostic.help}" if f.diagnostic.help else "")
        rendered = ",".join(f"{k}={escape_property(v)}" for k, v in props)
        lines.append(f"::{_LEVEL[f.severity]} {rendered}::{escape_data(body)}")
    return "".join(line + "\n" for line in lines)
