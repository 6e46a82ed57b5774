"""Process calls as argv: the tool is a bare name or an absolute path, never a shell string."""

from __future__ import annotations

import re

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.paths import quote
from policy_engine.patterns.argv import CompiledSlot, first_mismatch

_BARE_TOOL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_SHELL_CHARS = frozenset(" \t\n\r;&|<>$`\\\"'(){}[]*?!~#")


def check_argv_shape(tool: object, args: object) -> None:
    """Refuse anything that is not a plain argv.

    A tool with spaces or shell metacharacters is a shell string (``"git status; rm -rf /"``)
    and is refused with ``POLICY.DENY_TOOL``; a non-string tool or argument is malformed input
    (``SCHEMA.VALIDATION_FAILED``).
    """
    if not isinstance(tool, str) or not tool:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, "tool must be a string")
    try:  # str.join accepts exactly the str instances: one C loop instead of isinstance per arg
        # a tuple of types, not ``tuple | list``: the union would be built on every call
        joined = "".join(args) if isinstance(args, (tuple, list)) else None
    except TypeError:
        joined = None
    if joined is None:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                "args must be a list of strings")
    if "\x00" in joined:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, "an argument contains NUL")
    if type(tool) is str and tool in _GOOD_TOOLS:  # checked before: tools repeat call after call
        return
    if not _SHELL_CHARS.isdisjoint(tool) or "\x00" in tool:
        raise PolicyEngineError(
            ErrorCode.DENY_TOOL,
            f"shell strings are not accepted: tool {quote(tool)} must be a bare name or an "
            "absolute path",
        )
    if tool.startswith("/"):
        segs = tool.split("/")[1:]
        if any(s in ("", ".", "..") for s in segs):
            raise PolicyEngineError(
                ErrorCode.DENY_TOOL, f"tool path {quote(tool)} is not a normalized absolute path"
            )
    elif _BARE_TOOL.fullmatch(tool) is None:
        raise PolicyEngineError(
            ErrorCode.DENY_TOOL, f"tool {quote(tool)} must be a bare name or an absolute path"
        )
    if type(tool) is str:  # a subclass could compare equal to a name it does not spell
        if len(_GOOD_TOOLS) >= _GOOD_TOOLS_SIZE:  # a bound, not an LRU: a miss re-checks one
            _GOOD_TOOLS.clear()
        _GOOD_TOOLS.add(tool)


_GOOD_TOOLS: set[str] = set()
"""Tool names (exact ``str`` objects) that passed the checks above."""
_GOOD_TOOLS_SIZE = 1024


def describe_mismatch(slots: tuple[CompiledSlot, ...], args: tuple[str, ...]) -> str | None:
    """``None`` when ``args`` fit, else a public reason naming the first bad argument (1-based)."""
    bad = first_mismatch(slots, args)
    if bad is None:
        return None
    if bad >= len(args):
        return f"argument {bad + 1} is missing: the template expects more arguments"
    # the value itself is not quoted: reasons reach logs and printed results, and an argument
    # may be a secret (`--token=...`)
    return (f"argument {bad + 1} ({len(args[bad])} characters) is not allowed by the "
            "template")
