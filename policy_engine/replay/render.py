"""Rendering replay and diff results: text for terminals, JSON, and a Markdown PR comment."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from policy_engine.replay.engine import Replayed, Verdict


def _verdict(v: Verdict | None) -> str:
    if v is None:
        return "-"
    text = v.decision + (f" {v.code}" if v.code else "")
    return text + (f" by {v.rule}" if v.rule else " (no rule)")


def summary(results: Sequence[Replayed]) -> dict[str, int]:
    counts = Counter(r.status for r in results)
    return {"total": len(results), "changed": counts["changed"], "same": counts["same"],
            "unreplayable": counts["unreplayable"]}


def to_json(results: Sequence[Replayed], *, show_all: bool = False) -> dict[str, Any]:
    shown = [r for r in results if show_all or r.status != "same"]
    return {"summary": summary(results), "calls": [r.to_json() for r in shown]}


def to_text(results: Sequence[Replayed], *, show_all: bool = False) -> str:
    lines: list[str] = []
    for r in results:
        if r.status == "changed" or (show_all and r.status == "same"):
            lines.append(f"{r.status}: {r.envelope_id} {r.capability}")
            lines.append(f"  before: {_verdict(r.old)}")
            lines.append(f"  after:  {_verdict(r.new)}")
    for r in results:
        if r.status == "unreplayable":
            lines.append(f"unreplayable: {r.envelope_id} {r.capability}: {r.note}")
    s = summary(results)
    lines.append(f"{s['total']} call(s): {s['changed']} changed, {s['same']} unchanged, "
                 f"{s['unreplayable']} not replayable")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(results: Sequence[Replayed], *, title: str = "Policy decision changes") -> str:
    s = summary(results)
    lines = [f"### {title}", "",
             f"{s['total']} request(s): **{s['changed']} changed**, {s['same']} unchanged, "
             f"{s['unreplayable']} not replayable", ""]
    changed = [r for r in results if r.status == "changed"]
    if changed:
        lines += ["| request | before | after |", "|---|---|---|"]
        lines += [f"| `{_cell(r.capability)}` ({_cell(r.envelope_id)}) | "
                  f"{_cell(_verdict(r.old))} | {_cell(_verdict(r.new))} |" for r in changed]
    else:
        lines.append("No decision changes.")
    skipped = [r for r in results if r.status == "unreplayable"]
    if skipped:
        lines += ["", "<details><summary>not replayable</summary>", ""]
        lines += [f"- `{_cell(r.capability)}`: {_cell(r.note)}" for r in skipped]
        lines += ["", "</details>"]
    return "\n".join(lines)
