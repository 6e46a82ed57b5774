"""The fs read result's canonical JSON written out member by member (``evidence/digest.py``)
is the encoder's text to the byte, for every value the encoder takes; anything else goes the
encoder's way, with its answer or its error."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest

from policy_engine.evidence.digest import canonical_json, digest_json
from policy_engine.model import Digest

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encoder_bytes(value: Any) -> bytes:
    """What ``canonical_json`` was before the read's own rendering: the encoder, always."""
    return _ENCODER.encode(value).encode("utf-8", "surrogatepass")


def read_out(**changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": "/w/data/hello.txt", "offset": 0, "size": 6,
        "digest": {"algo": "sha256", "b64": "vsnbwwmi4oqO5fhkFRpIYQaouqeRBNl49Q6BRxGB4BQ=",
                   "size": 6},
        "bytes_b64": "aGVsbG8K", "preview_truncated": False, "resolver": "openat2"}
    out.update(changes)
    return out


class Kind(enum.IntEnum):
    ONE = 1


class Text(str):
    """A str subclass (a caller's own type)."""


NAMES = ["/w/plain.txt", '/w/quo"te\\back.txt', "/w/tab\there\nnew\rret\x08\x0c.txt",
         "/w/ctl\x00\x01\x1f\x7f.txt", "/w/é ü 名前 🙂.txt", "/w/lone\udcff.txt",
         "/w/\u2028\u2029.txt", ""]


@pytest.mark.parametrize("path", NAMES)
def test_any_path_renders_as_the_encoder_does(path: str) -> None:
    for truncated in (False, True):
        out = read_out(path=path, preview_truncated=truncated, bytes_b64=path,
                       resolver=path)
        assert canonical_json(out) == encoder_bytes(out)
        assert digest_json(out) == Digest.of(encoder_bytes(out))


@pytest.mark.parametrize("changes", [
    {"offset": 2**80, "size": -1},  # big and negative ints: their repr
    {"digest": {"algo": "sha256", "b64": "x", "size": 2**70}},
    {"offset": True},  # a bool where an int is: the encoder's `true`
    {"preview_truncated": 1},  # an int where a bool is: `1`
    {"size": Kind.ONE},  # an int subclass: the encoder's way
    {"path": Text("/w/sub")},  # a str subclass: the encoder's way
    {"size": 6.0},  # a float: the encoder's way
    {"offset": None},
    {"digest": {"algo": "sha256", "b64": "x"}},  # a member missing
    {"digest": {"algo": "sha256", "b64": "x", "size": 1, "more": 2}},  # one more
    {"digest": "sha256:x"},  # not an object
    {"extra": 1},  # eight members: not the read's shape
], ids=["big-ints", "big-digest-size", "bool-offset", "int-flag", "int-enum", "str-subclass",
        "float", "none", "digest-short", "digest-long", "digest-string", "extra-member"])
def test_other_values_get_the_encoders_answer(changes: dict[str, Any]) -> None:
    out = read_out(**changes)
    assert canonical_json(out) == encoder_bytes(out)


def test_what_the_encoder_refuses_is_still_refused() -> None:
    out = read_out(path=b"/w/bytes")  # not JSON: the encoder's own error
    with pytest.raises(TypeError):
        encoder_bytes(out)
    with pytest.raises(TypeError):
        canonical_json(out)
    nested = read_out(digest={"algo": "sha256", "b64": object(), "size": 1})
    with pytest.raises(TypeError):
        canonical_json(nested)
