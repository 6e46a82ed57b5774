"""JSON parsing that remembers where each value starts, so a JSON pointer maps to line:col."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class JsonSyntaxError(Exception):
    """Not JSON: what is wrong and where (1-based line and column)."""

    message: str
    line: int
    column: int


@dataclass(frozen=True, slots=True)
class Located:
    """A parsed document and the offset of every value by JSON pointer (``""`` is the root)."""

    value: Any
    offsets: dict[str, int]
    text: str

    def position(self, pointer: str) -> tuple[int, int]:
        """1-based (line, column) of the value at ``pointer``, or of its nearest parent."""
        while pointer not in self.offsets and pointer:
            pointer = pointer.rsplit("/", 1)[0]
        return line_col(self.text, self.offsets.get(pointer, 0))


def line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def escape(token: str) -> str:
    """One JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def parse(text: str) -> Located:
    """Parse ``text`` as one JSON value (duplicate keys refused).

    :raises JsonSyntaxError: with the position of the first problem.
    """
    offsets: dict[str, int] = {}
    try:
        value, end = _value(text, _skip(text, 0), "", offsets)
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(exc.msg, exc.lineno, exc.colno) from None
    end = _skip(text, end)
    if end != len(text):
        line, col = line_col(text, end)
        raise JsonSyntaxError("extra data after the JSON value", line, col)
    return Located(value, offsets, text)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _fail(text: str, i: int, message: str) -> json.JSONDecodeError:
    return json.JSONDecodeError(message, text, i)


def _value(text: str, i: int, pointer: str, offsets: dict[str, int]) -> tuple[Any, int]:
    offsets[pointer] = i
    if i >= len(text):
        raise _fail(text, i, "expected a value")
    if text[i] == "{":
        return _object(text, i, pointer, offsets)
    if text[i] == "[":
        items: list[Any] = []
        i = _skip(text, i + 1)
        if i < len(text) and text[i] == "]":
            return items, i + 1
        while True:
            item, i = _value(text, _skip(text, i), f"{pointer}/{len(items)}", offsets)
            items.append(item)
            i = _skip(text, i)
            if i < len(text) and text[i] == ",":
                i += 1
                continue
            if i < len(text) and text[i] == "]":
                return items, i + 1
            raise _fail(text, i, "expected `,` or `]` in an array")
    # a scalar: the standard decoder, so numbers, strings and literals are read exactly as json
    return _DECODER.raw_decode(text, i)


def _object(text: str, i: int, pointer: str, offsets: dict[str, int]) -> tuple[Any, int]:
    obj: dict[str, Any] = {}
    i = _skip(text, i + 1)
    if i < len(text) and text[i] == "}":
        return obj, i + 1
    while True:
        if i >= len(text) or text[i] != '"':
            raise _fail(text, i, "expected a property name in double quotes")
        key_at = i
        key, i = _DECODER.raw_decode(text, i)
        if key in obj:
            raise _fail(text, key_at, f"duplicate key `{key}`")
        i = _skip(text, i)
        if i >= len(text) or text[i] != ":":
            raise _fail(text, i, "expected `:` after a property name")
        obj[key], i = _value(text, _skip(text, i + 1), f"{pointer}/{escape(key)}", offsets)
        i = _skip(text, i)
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
            continue
        if i < len(text) and text[i] == "}":
            return obj, i + 1
        raise _fail(text, i, "expected `,` or `}` in an object")
