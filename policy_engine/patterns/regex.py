"""Policy regexes (argument templates, env names) compiled with RE2: matching is linear-time.

An argument or an environment-variable name is chosen by the agent, and a backtracking engine
lets a policy regex such as ``/(a|aa)+/`` spend hours on a 61-byte argument inside the guard,
before any evidence is written. RE2 runs in time linear in the input for every pattern it
accepts; it has no backreferences and no lookaround, and such a pattern is refused when the
policy is checked (SBP208). The syntax is otherwise Python's, with these differences: ``\\d``,
``\\w``, ``\\s`` and ``\\b`` are ASCII-only (use ``\\p{L}``, ``\\p{N}`` for Unicode classes) and
``$`` matches only at the very end (Python's also matches before a final newline).
"""

from __future__ import annotations

from functools import lru_cache

import re2

MAX_REGEX_MEMORY = 8 << 20
"""Bytes RE2 may use for one compiled program; a larger pattern is refused (SBP208)."""


def _options() -> re2.Options:
    opts = re2.Options()
    opts.never_capture = True  # only "does it match" is asked: no submatch bookkeeping
    opts.log_errors = False    # errors are diagnostics, never lines on stderr
    opts.max_mem = MAX_REGEX_MEMORY
    return opts


_OPTIONS = _options()
_BOTH = re2._re2.RE2.Anchor.ANCHOR_BOTH
_NONE = re2._re2.RE2.Anchor.UNANCHORED
_NO_MATCH = (-1, -1)


class RegexError(ValueError):
    """A pattern RE2 cannot run; the message says why."""


class PolicyRegex:
    """One compiled pattern: :meth:`fullmatch` (argument templates), :meth:`search` (env)."""

    __slots__ = ("pattern", "_prog")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            encoded = pattern.encode("utf-8")
        except UnicodeEncodeError:
            raise RegexError("the pattern is not valid Unicode text") from None
        prog = re2._re2.RE2(encoded, _OPTIONS)
        if not prog.ok():
            raise RegexError(_explain(prog.error()))
        self._prog = prog

    def fullmatch(self, text: str) -> bool:
        data = text.encode("utf-8", "surrogatepass")  # _encode, inline: argv templates run it
        return bool(self._prog.Match(_BOTH, data, 0, len(data))[0] != _NO_MATCH)

    def search(self, text: str) -> bool:
        data = _encode(text)
        return bool(self._prog.Match(_NONE, data, 0, len(data))[0] != _NO_MATCH)


def _encode(text: str) -> bytes:
    # a lone surrogate (JSON "\ud800") stays one character to `.`, as it is to Python's `re`
    return text.encode("utf-8", "surrogatepass")


def _explain(error: object) -> str:
    msg = error.decode("utf-8", "replace") if isinstance(error, bytes) else str(error)
    if msg.startswith(("invalid perl operator", "invalid escape sequence")):
        return (f"{msg} (policy regexes run on RE2: no backreferences, lookahead, lookbehind "
                "or atomic groups)")
    if "too large" in msg:
        return f"{msg} (at most {MAX_REGEX_MEMORY >> 20} MiB of RE2 program)"
    return msg


@lru_cache(maxsize=4096)
def compile_policy_regex(pattern: str) -> PolicyRegex:
    """Compile ``pattern`` once (cached); :class:`RegexError` when RE2 refuses it."""
    return PolicyRegex(pattern)


def re2_problem(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern``, or ``None``."""
    try:
        compile_policy_regex(pattern)
    except RegexError as exc:
        return str(exc)
    return None


MAX_REGEX_DEPTH = 50
"""Python's regex parser recurses per group: 1,000 nested groups is a RecursionError."""


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be used as a regex (nested too deeply, or invalid), or ``None``."""
    depth = deepest = 0
    escaped = in_class = False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(0, depth - 1)
    if deepest > MAX_REGEX_DEPTH:
        return f"groups nested {deepest} deep; at most {MAX_REGEX_DEPTH} are allowed"
    try:  # the guard runs the pattern on RE2: what RE2 refuses is refused here
        return re2_problem(pattern)
    except (RecursionError, OverflowError, MemoryError) as exc:
        return f"too complex to compile ({type(exc).__name__})"
