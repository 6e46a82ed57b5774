"""Path globs: validation, `~` expansion and segment-bounded matching on normalized paths.

Syntax: absolute patterns (``/workspace/**``), home-relative (``~/.ssh/**``), anywhere-patterns
(``**/.env``) and, in a permit rule only, a leading path variable (``$SESSION/**``: the calling
session's workspace, resolved by the profile builder per call, ``resolve_variables``). ``**``
is a whole segment and matches zero or more segments, so ``/a/**`` admits ``/a`` and everything
beneath it but never ``/a-evil``; ``*`` and ``?`` stay inside one segment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

_WILDCARDS = ("*", "?")
PATH_VARIABLES: dict[str, str] = {
    "$SESSION": "the calling session's workspace directory; nothing outside a session",
}
"""The variables a permit rule's path may start with, and what each names."""
_VARIABLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?")


def path_variable(pattern: str) -> str | None:
    """The ``$NAME`` ``pattern`` starts with (known or not), or ``None``."""
    if not pattern.startswith("$"):
        return None
    found = _VARIABLE.match(pattern)
    return "$" + (found.group(1) or "") if found else "$"


def validate_policy_glob(pattern: str) -> str | None:
    """``validate_glob`` for a permit rule's paths: a known variable may start the pattern
    (``$SESSION``, ``$SESSION/**``); the rest is checked as the absolute glob it resolves to."""
    name = path_variable(pattern)
    if name is None:
        return validate_glob(pattern)
    rest = pattern[len(name):]
    if name not in PATH_VARIABLES or (rest and not rest.startswith("/")):
        return validate_glob(pattern)  # the unknown-variable message, or a glued `$SESSIONx`
    return _why_not(pattern, "/var" + rest) if rest else None


def _why_not(pattern: str, stand_in: str) -> str | None:
    why = validate_glob(stand_in)
    return None if why is None else why.replace(f"`{stand_in}`", f"`{pattern}`")


def validate_glob(pattern: str) -> str | None:
    """Return why ``pattern`` is not a valid path glob, or ``None`` if it is (a path variable
    is not one: it is resolved before a glob is matched, see ``validate_policy_glob``)."""
    if not pattern:
        return "empty path pattern"
    name = path_variable(pattern)
    if name is not None:
        known = ", ".join(f"`{k}` ({v})" for k, v in PATH_VARIABLES.items())
        if name not in PATH_VARIABLES or not (pattern == name or
                                              pattern.startswith(name + "/")):
            shown = pattern.split("/", 1)[0]
            return f"unknown path variable `{shown}`: known are {known}"
        return (f"path variable `{name}` may only start a permit rule's paths "
                "(a forbid, a grant or a named profile names fixed paths)")
    if "\x00" in pattern:
        return "path pattern contains a NUL byte"
    if not (pattern.startswith("/") or pattern.startswith("~/") or pattern == "~"
            or pattern.startswith("**/") or pattern == "**"):
        return f"path pattern `{pattern}` must be absolute, start with `~/` or `**/`"
    body = pattern[1:] if pattern.startswith("~") else pattern
    for seg in body.split("/")[1:] if body.startswith("/") else body.split("/"):
        if seg in (".", ".."):
            return f"path pattern `{pattern}` contains a `{seg}` segment"
        if "**" in seg and seg != "**":
            return f"`**` must be a whole segment in `{pattern}`"
        if seg == "" and not pattern.endswith("/"):
            return f"path pattern `{pattern}` contains an empty segment"
    return None


def resolve_variables(pattern: str, values: Mapping[str, str | None]) -> str | None:
    """``pattern`` with its leading path variable replaced by its value; ``None`` when the
    variable has no usable value here (a call outside a session): the pattern matches nothing."""
    name = path_variable(pattern)
    if name is None:
        return pattern
    value = values.get(name)
    # fail closed on a value no glob can name exactly: relative, the root itself (`/**` would
    # be everything) or holding a wildcard (the glob syntax has no escape: `*` would widen it)
    if not value or not value.startswith("/") or not value.strip("/") \
            or any(w in value for w in _WILDCARDS):
        return None
    return value.rstrip("/") + pattern[len(name):] if pattern != name else value


def expand_home(pattern: str, home: str) -> str:
    """Expand a leading ``~`` to ``home``; ``**/x`` becomes ``/**/x``."""
    if pattern == "~":
        return home
    if pattern.startswith("~/"):
        return home.rstrip("/") + pattern[1:]
    if pattern == "**" or pattern.startswith("**/"):
        return "/" + pattern
    return pattern


def segment_regex(seg: str) -> str:
    """The regex of one glob segment (``*`` and ``?`` never cross a ``/``)."""
    out = []
    for ch in seg:
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        else:
            out.append(re.escape(ch))
    return "".join(out)


@lru_cache(maxsize=4096)
def glob_body(pattern: str) -> str:
    """The unanchored regex of an absolute (already home-expanded) glob, for alternations."""
    segs = [s for s in pattern.split("/") if s]
    if not segs:
        return "/"
    parts: list[str] = []
    for i, seg in enumerate(segs):
        if seg == "**":
            if i == len(segs) - 1:
                parts.append(r"(?:/.*)?")
            else:
                parts.append(r"(?:/[^/]+)*")
        else:
            parts.append("/" + segment_regex(seg))
    rx = "".join(parts)
    if rx.startswith(r"(?:/.*)?"):  # the pattern `/**`
        rx = r"/.*"
    return rx


@lru_cache(maxsize=4096)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile an absolute (already home-expanded) glob to an anchored regex.

    Anchored with ``\\Z``, never ``$``: ``$`` also matches before a final newline, and
    ``/a/b\\n`` is another file than ``/a/b``."""
    return re.compile("^" + glob_body(pattern) + r"\Z", re.DOTALL)


def resolved_form(pattern: str, resolve: Callable[[str], str]) -> str | None:
    """``pattern`` under its literal prefix's real name (``resolve``: ``os.path.realpath``) when
    that prefix runs through a symlink (a HOME given through a link, macOS ``/tmp``): the same
    files spelt as the kernel reaches them; ``None`` when the prefix is its own real name."""
    segs = [s for s in pattern.split("/") if s]
    n = next((i for i, s in enumerate(segs) if any(w in s for w in _WILDCARDS)), len(segs))
    if n == 0:
        return None
    prefix = "/" + "/".join(segs[:n])
    real = resolve(prefix)
    if real == prefix or not real.startswith("/"):
        return None
    rest = segs[n:]
    return real.rstrip("/") + "/" + "/".join(rest) if rest else real


def literal_prefix(pattern: str) -> str:
    """The longest leading run of wildcard-free segments (``/workspace/**`` → ``/workspace``)."""
    out: list[str] = []
    for seg in (s for s in pattern.split("/") if s):
        if any(w in seg for w in _WILDCARDS):
            break
        out.append(seg)
    return "/" + "/".join(out)


def is_literal(pattern: str) -> bool:
    return not any(w in pattern for w in _WILDCARDS)


@dataclass(frozen=True, slots=True)
class PathGlob:
    """A compiled, home-expanded path glob."""

    pattern: str
    regex: re.Pattern[str] = field(compare=False, repr=False)

    @staticmethod
    def of(pattern: str, home: str = "/root") -> PathGlob:
        expanded = expand_home(pattern, home)
        return PathGlob(expanded, glob_regex(expanded))

    def matches(self, normalized_path: str) -> bool:
        """``normalized_path`` must already be absolute and normalized (see guard.paths)."""
        return self.regex.match(normalized_path) is not None
