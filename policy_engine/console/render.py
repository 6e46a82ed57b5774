"""Rendering: the Jinja2 environment (autoescaped), time formats, a rule's source lines."""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from starlette.requests import Request

from policy_engine.console.auth import Viewer
from policy_engine.graph.policyset import PolicySet

TEMPLATES = Path(__file__).with_name("templates")
SOURCE_CONTEXT = 3
"""Lines shown before and after a deciding rule's line."""


@lru_cache(maxsize=1)
def _environment() -> Any:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      finalize=reveal)
    env.filters["when"] = when
    env.filters["dtlocal"] = lambda ms: (time.strftime("%Y-%m-%dT%H:%M", time.gmtime(ms / 1000))
                                         if isinstance(ms, int) else "")
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True,
                                                 ensure_ascii=False, default=str)
    return env


def page(name: str, request: Request, who: Viewer | None, **values: Any) -> str:
    """The page ``name`` for ``who`` (``None``: signed out)."""
    base = str(request.scope.get("root_path", "")).rstrip("/")
    return str(_environment().get_template(name).render(request_path=request.url.path,
                                                       base=base, who=who, **values))


def reveal(value: Any) -> Any:
    """``value`` with every invisible format character (bidi overrides and isolates, zero-width
    characters, Unicode category Cf) and control character shown as ``\\uXXXX``: a person
    sees what an agent sent, in the order it was sent (Trojan Source, CVE-2021-42574).
    Applied to every value a template prints, before HTML escaping."""
    if not isinstance(value, str) or value.isascii() and value.isprintable():
        return value
    shown = "".join(c if c in "\n\t" or (unicodedata.category(c) not in ("Cf", "Cc", "Co", "Cs")
                                            and c not in "\u2028\u2029")
                    else f"\\u{ord(c):04x}" for c in value)
    if hasattr(value, "__html__"):  # markup already escaped (the SVG charts): stays markup
        from markupsafe import Markup

        return Markup(shown)  # noqa: S704 - the input was markup; only characters were named
    return shown


def when(ms: Any) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d} UTC"


def rule_source(rule: Any, files: Sequence[Path],
                policyset: PolicySet) -> list[tuple[int, str, bool]] | None:
    """The lines around a deciding rule, read from the loaded policy's own files only (a
    record naming another file shows nothing: evidence must not make the console read it)."""
    if not isinstance(rule, dict) or not isinstance(rule.get("line"), int):
        return None
    allowed = {str(Path(str(f)).resolve()) for f in (*files, *policyset.files)}
    where = str(rule.get("file") or "")
    try:
        path = Path(where).resolve()
    except (OSError, ValueError):
        return None
    if str(path) not in allowed:
        return None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    line = int(rule["line"])
    lo, hi = max(1, line - SOURCE_CONTEXT), min(len(lines), line + SOURCE_CONTEXT)
    return [(n, lines[n - 1], n == line) for n in range(lo, hi + 1)]
