"""reject_lone_surrogates: the flat-op shortcut refuses and accepts exactly what the walk does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from policy_engine.model import FsReadOp
from policy_engine.model.text import (
    MAX_WALK,
    SURROGATE_FREE,
    reject_lone_surrogates,
    surrogate_free_json,
)

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


@pytest.mark.parametrize("escape", ["\\ud800", "\\uDFFF", "\\udbff\\udc00", "\\uDa00"])
def test_json_with_a_surrogate_escape_is_walked(escape: str) -> None:
    """The scan that lets the service skip the walk (``surrogate_free_json``) says no to any
    surrogate escape, paired or not, in either case; the lone ones are refused (by pydantic's
    JSON parser itself, or by the walk the service falls back to with ``json.loads``)."""
    raw = ('{"op": {"kind": "fs.read", "path": "/w/' + escape + '"}}').encode()
    assert not surrogate_free_json(raw)
    if escape != "\\udbff\\udc00":  # a pair is one character: valid Unicode
        context = {SURROGATE_FREE: True} if surrogate_free_json(raw) else None
        with pytest.raises(ValidationError):
            _Doc.model_validate_json(raw, context=context)
        with pytest.raises(ValidationError, match="lone surrogate"):
            _Doc.model_validate(json.loads(raw))


@pytest.mark.parametrize("raw", [b'{"op": {"kind": "fs.read", "path": "/w/\\u00e9 x"}}',
                                 '{"op": {"kind": "fs.read", "path": "/w/漢字"}}'.encode(),
                                 b'{"op": {"kind": "fs.read", "path": "/w/a"}}'])
def test_json_without_one_skips_the_walk(raw: bytes) -> None:
    assert surrogate_free_json(raw)
    assert _Doc.model_validate_json(raw, context={SURROGATE_FREE: True}).op.path.startswith("/w/")


class _Doc(BaseModel):
    op: FsReadOp
