"""Refusal of text that is not Unicode: a lone surrogate (JSON's "\\udfff") cannot be encoded,
so it would crash evidence digests and responses instead of being refused; and the printable
form of a host path that is not UTF-8."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationInfo

MAX_WALK = 100_000  # values inspected; the loaders already bound depth and size


_SCALARS = (int, float, bool, type(None))


SURROGATE_FREE = "policy_engine.surrogate_free"
"""Validation context key: ``True`` when the JSON text being validated was seen to hold no
surrogate escape (:func:`surrogate_free_json`), so no string parsed from it can hold one."""

# ``\uD800``–``\uDFFF`` as JSON escapes them (either case); an escaped backslash followed by
# ``ud8..`` matches too, which only costs the walk
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def surrogate_free_json(raw: bytes) -> bool:
    """Whether JSON text ``raw`` cannot decode to a lone surrogate: UTF-8 cannot encode one,
    so only a ``\\uD8xx``–``\\uDFxx`` escape can make one (one scan of the bytes in C instead
    of a walk of every string of the grant, manifest and op in Python)."""
    return _SURROGATE_ESCAPE.search(raw) is None


def reject_lone_surrogates(data: Any, info: ValidationInfo | None = None) -> Any:
    """``data`` unchanged; raises ``ValueError`` when a string in it (keys included) holds a
    lone surrogate. For ``mode="before"`` validators of models built from JSON; ``info``'s
    context saying :data:`SURROGATE_FREE` (the JSON text was scanned) skips the walk."""
    if info is not None and info.context is not None and \
            info.context.get(SURROGATE_FREE) is True:
        return data
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
