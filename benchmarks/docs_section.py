"""Writes one benchmark's section of docs/benchmarks.md (`--write`), leaving the others alone."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def replace_section(heading: str, section: str, docs: Path = DOCS) -> None:
    """Replace the section that starts with ``heading`` (up to the next `## `) by ``section``,
    or append it when the file has none yet."""
    text = docs.read_text(encoding="utf-8") if docs.exists() else "# Benchmarks\n\n"
    start = text.find(heading)
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(heading))
        end = len(text) if nxt == -1 else nxt + 1
        text = text[:start] + section + ("\n" if nxt != -1 else "") + text[end:]
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
