"""Refusal of text that is not Unicode: a lone surrogate (JSON's "\\udfff") cannot be encoded,
so it would crash evidence digests and responses instead of being refused; and the printable
form of a host path that is not UTF-8."""

from __future__ import annotations

from typing import Any

MAX_WALK = 100_000  # values inspected; the loaders already bound depth and size


_SCALARS = (int, float, bool, type(None))


def reject_lone_surrogates(data: Any) -> Any:
    """``data`` unchanged; raises ``ValueError`` when a string in it (keys included) holds a
    lone surrogate. For ``mode="before"`` validators of models built from JSON."""
    if type(data) is dict and _flat_unicode(data):
        return data
    stack, seen = [data], 0
    while stack and seen < MAX_WALK:
        value = stack.pop()
        seen += 1
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"text at character {exc.start} is not valid Unicode (a lone "
                                 "surrogate); send UTF-8 text") from None
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return data


def _flat_unicode(data: dict[Any, Any]) -> bool:
    """Whether ``data`` holds only ASCII string keys and ASCII strings or plain scalars as values
    (an op as agents send it): then nothing in it can be a lone surrogate, found without the
    general walk (≈ 1 µs of an op's construction, every decision built from a dict)."""
    for key, value in data.items():
        if type(key) is not str or not key.isascii():
            return False
        if type(value) is str:
            if not value.isascii():
                return False
        elif type(value) not in _SCALARS:
            return False
    return True


def printable_path(path: str) -> str:
    """``path`` as text any JSON writer and terminal takes: the bytes of a host name that is not
    UTF-8 (``os.fsdecode`` keeps them as lone surrogates) shown as ``\\xff`` escapes."""
    try:
        raw = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate fsdecode never makes
        raw = path.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "backslashreplace")
