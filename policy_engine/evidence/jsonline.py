"""One evidence line as JSON, with its nesting bounded: the shared reader of verify and replay."""

from __future__ import annotations

import json
import re
from typing import Any

# Records the engine writes nest a handful of levels (an op's arguments are canonical JSON under
# `op`); 128 leaves room for any tool's arguments and stays far below the recursion limit that
# Python's JSON decoder would hit (~1,000 levels), which it reports as RecursionError, not a
# decoding error.
MAX_NESTING = 128

# A line's structural characters: an escape pair (inside a string), a quote, a bracket.
_TOKENS = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)


def nesting_exceeds(raw: bytes, limit: int = MAX_NESTING) -> bool:
    """Whether ``raw`` opens more than ``limit`` arrays/objects inside each other (brackets
    within strings do not count). Stops at the first level past the limit."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # cannot nest deeper than its brackets: the common case, no scan
    depth, in_string = 0, False
    for match in _TOKENS.finditer(raw):
        tok = match.group()
        if tok == b'"':
            in_string = not in_string
        elif in_string or len(tok) == 2:
            continue  # an escape pair, or a bracket inside a string
        elif tok in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def load_line(raw: bytes | str) -> Any:
    """The JSON value of one evidence line.

    :raises ValueError: not JSON, or nested more than :data:`MAX_NESTING` levels deep.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if nesting_exceeds(data):
        raise ValueError(f"the line nests arrays/objects more than {MAX_NESTING} levels deep")
    try:
        return json.loads(data)
    except RecursionError:  # unreachable after the bound; kept so no reader can crash on depth
        raise ValueError("the line nests arrays/objects too deeply") from None
