"""reject_lone_surrogates: the flat-op shortcut refuses and accepts exactly what the walk does."""

from __future__ import annotations

from typing import Any

import pytest

from policy_engine.model.text import MAX_WALK, reject_lone_surrogates

BAD = "a\udfffb"


@pytest.mark.parametrize("data", [
    {"kind": "fs.read", "path": BAD},
    {BAD: "x"},
    {"kind": "proc.exec", "args": ["ok", BAD]},
    {"kind": "net.http", "headers": {"x": BAD}},
    {"path": "é" + BAD},  # not ASCII: the general walk decides
    [BAD],
    BAD,
])
def test_a_lone_surrogate_anywhere_is_refused(data: Any) -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        reject_lone_surrogates(data)


@pytest.mark.parametrize("data", [
    {"kind": "fs.read", "path": "/w/a.txt", "offset": 1, "len": None, "x": 1.5, "y": True},
    {"kind": "fs.read", "path": "/w/é ü 漢字"},
    {"kind": "proc.exec", "args": ["a", "b"], "env": {"K": "v"}},
    {1: "non-string key"},
])
def test_unicode_passes_unchanged(data: Any) -> None:
    assert reject_lone_surrogates(data) is data


def test_the_walk_stays_bounded() -> None:
    deep: Any = BAD
    for _ in range(10):
        deep = [deep] * 3
    with pytest.raises(ValueError, match="lone surrogate"):
        reject_lone_surrogates(deep)
    # past MAX_WALK values nothing more is inspected (the loaders bound size and depth)
    hidden = [BAD] + ["ok"] * MAX_WALK
    reject_lone_surrogates(hidden)
