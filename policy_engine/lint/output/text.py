"""Text output: each finding like the diagnostics renderer (location, ID, source, caret, help)."""

from __future__ import annotations

from policy_engine.dsl.render import render_diagnostic
from policy_engine.errors import Severity
from policy_engine.lint.model import LintResult


def render_text(result: LintResult, *, color: bool = False) -> str:
    """Unsuppressed findings, a blank line between each, then a one-line summary."""
    active = result.active()
    blocks = [render_diagnostic(f.diagnostic, color=color,
                                source=result.sources.get(f.span.file) if f.span else None)
              for f in active]
    return "\n\n".join([*blocks, summary(result)]) + "\n"


def summary(result: LintResult) -> str:
    active = result.active()
    counts = {s: sum(1 for f in active if f.severity is s) for s in Severity}
    parts = [f"{len(result.files)} file(s) linted", f"{counts[Severity.ERROR]} error(s)",
             f"{counts[Severity.WARNING]} warning(s)", f"{counts[Severity.NOTE]} note(s)"]
    hidden = len(result.findings) - len(active)
    if hidden:
        parts.append(f"{hidden} suppressed")
    if result.unusable:
        parts.append(f"{len(result.unusable)} unusable input(s)")
    return ": ".join(parts[:1]) + ": " + ", ".join(parts[1:])
