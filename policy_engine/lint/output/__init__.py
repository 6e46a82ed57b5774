"""Renderers of a LintResult: text, json, sarif and github; each returns the whole document."""

from __future__ import annotations

from collections.abc import Callable

from policy_engine.lint.model import LintResult
from policy_engine.lint.output.github import render_github
from policy_engine.lint.output.json_out import render_json
from policy_engine.lint.output.sarif import render_sarif
from policy_engine.lint.output.text import render_text

Renderer = Callable[[LintResult], str]

FORMATS: dict[str, Renderer] = {
    "text": render_text,
    "json": render_json,
    "sarif": render_sarif,
    "github": render_github,
}

__all__ = ["FORMATS", "Renderer"]
