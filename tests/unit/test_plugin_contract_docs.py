"""docs/plugins.md is the executor contract's reference: every field is there (issue 16)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from policy_engine.executor import ExecContext
from policy_engine.hookspecs import HOOK_API_VERSION
from policy_engine.model import Limits, Profile

DOC = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    match = re.search(rf"^###? {re.escape(title)}\n(.*?)(?=^###? )", DOC, re.S | re.M)
    assert match is not None, f"docs/plugins.md has no section `{title}`"
    return match.group(1)


@pytest.mark.parametrize(("title", "fields"), [
    ("`ExecContext`", [f.name for f in dataclasses.fields(ExecContext)]),
    ("`Profile`", list(Profile.model_fields)),
    ("`Limits`", list(Limits.model_fields)),
])
def test_every_field_is_documented(title: str, fields: list[str]) -> None:
    section = _section(title)
    missing = [f for f in fields if f"`{f}`" not in section]
    assert missing == []


def test_the_contract_sections_are_there() -> None:
    for title in ("Exit codes", "`cwd` and `root_fs`", "What the engine reads from `ExecResult`",
                  "Threads", "Hook API version", "Plugin-defined op kinds: not now, and why"):
        assert _section(title).strip()
    assert f"`{HOOK_API_VERSION}`".replace(" ", "") in _section("Hook API version") \
        .replace(" ", "")
