"""A set of path globs compiled to string tests: exact paths, subtrees, anywhere-names, regex rest.

``patterns.paths.glob_regex`` gives one backtracking regex per glob; a forbid list holding the
secret globs of the built-in rule, the policy's rule and the profile's deny-list joined them into
one long alternation costing microseconds on every fs decision. Most globs are one of three
literal shapes that a string method answers exactly on a *normalized* path (absolute, no empty,
``.`` or ``..`` segment, no trailing ``/``; ``guard.paths.normalize_path``):

* a wildcard-free glob ``/etc/shadow``: the path equals it (a set lookup);
* ``P/**`` with ``P`` wildcard-free: the path is ``P`` or starts with ``P + "/"``
  (``str.startswith`` with a tuple); ``/**`` alone admits every path;
* ``/**/T`` (``**/T`` expanded) with ``T`` wildcard-free segments: the path ends with ``"/" + T``
  (``str.endswith`` with a tuple). ``(?:/[^/]+)*`` before ``/T`` admits any run of non-empty
  segments, and every prefix of a normalized path that ends before a ``/`` is such a run.

One shape keeps a regex but a cheap one: ``/**/N`` with ``N`` a single segment holding
wildcards (``**/*.pem``) matches exactly when the path's last segment matches ``N`` (by the same
argument), so those names are joined into one alternation matched on the last segment alone,
without the backtracking over every segment the whole-path regex does.

Every other glob keeps its regex, deduplicated and joined into one alternation.
``tests/unit/test_guard_globset.py`` checks the set against the per-glob regexes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

from policy_engine.patterns.paths import expand_home, glob_body, segment_regex, validate_glob

Match = Callable[[str], bool]


def _literal(seg: str) -> bool:
    return "*" not in seg and "?" not in seg


class GlobSet:
    """Globs (``~`` expanded with ``home``) matched on normalized paths.

    :param forbid: how an invalid glob reads: in a forbid it admits everything (a broken deny
        must never shrink), in a permit nothing.
    """

    __slots__ = ("everything", "exact", "prefixes", "tails", "names", "regex", "match")

    def __init__(self, patterns: Iterable[str], home: str, *, forbid: bool) -> None:
        exact: set[str] = set()
        prefixes: set[str] = set()
        tails: set[str] = set()
        names: dict[str, None] = {}  # last-segment regexes, ordered and deduplicated
        bodies: dict[str, None] = {}  # ordered and deduplicated
        self.everything = False
        for pat in patterns:
            if validate_glob(pat) is not None:
                if forbid:
                    self.everything = True
                continue
            expanded = expand_home(pat, home)
            segs = [s for s in expanded.split("/") if s]
            if all(_literal(s) and s != "**" for s in segs):
                exact.add("/" + "/".join(segs))
            elif segs[-1] == "**" and all(_literal(s) and s != "**" for s in segs[:-1]):
                if len(segs) == 1:
                    self.everything = True
                else:
                    prefix = "/" + "/".join(segs[:-1])
                    exact.add(prefix)
                    prefixes.add(prefix + "/")
            elif segs[0] == "**" and len(segs) > 1 and all(
                    _literal(s) and s != "**" for s in segs[1:]):
                tails.add("/" + "/".join(segs[1:]))
            elif len(segs) == 2 and segs[0] == "**" and segs[1] != "**":
                names[segment_regex(segs[1])] = None
            else:
                bodies[glob_body(expanded)] = None
        self.exact = frozenset(exact)
        self.prefixes = tuple(sorted(prefixes))
        self.tails = tuple(sorted(tails))
        # matched at the last segment's start (``Pattern.match(path, pos)``), hence no ``^``
        self.names = (re.compile("(?:" + "|".join(names) + r")\Z", re.DOTALL) if names
                      else None)
        self.regex = re.compile("^(?:" + "|".join(bodies) + r")\Z", re.DOTALL) if bodies else None
        self.match = self._build()

    def _build(self) -> Match:
        """The cheapest test for this set: only the parts it holds are consulted."""
        if self.everything:
            return _always
        exact, prefixes, tails = self.exact, self.prefixes, self.tails
        rx = _regex_test(self.names, self.regex)
        if len(prefixes) > _MANY_PREFIXES:
            # `startswith` over a tuple tries every prefix; a path has few ancestors: look each
            # one up instead (`P/` prefixes a normalized path exactly when a `/` of the path
            # ends it)
            hit = _AncestorSet(prefixes).hit
            if rx is None and not tails:
                return lambda p: p in exact or hit(p)
            return lambda p: (p in exact or hit(p) or p.endswith(tails)
                              or (rx is not None and rx(p) is not None))
        if rx is None:
            if not tails:
                return lambda p: p in exact or p.startswith(prefixes)
            return lambda p: p in exact or p.startswith(prefixes) or p.endswith(tails)
        return lambda p: (p in exact or p.startswith(prefixes) or p.endswith(tails)
                          or rx(p) is not None)

    def admits(self, path: str) -> bool:
        return self.match(path)


def _regex_test(names: re.Pattern[str] | None,
                whole: re.Pattern[str] | None) -> Callable[[str], object] | None:
    """The regex part of a set: names on the last segment, then whole-path regexes."""
    if names is None:
        return whole.match if whole is not None else None
    name_at = names.match
    if whole is None:
        return lambda p: name_at(p, p.rfind("/") + 1)
    whole_match = whole.match
    return lambda p: name_at(p, p.rfind("/") + 1) or whole_match(p)


_MANY_PREFIXES = 32


class _AncestorSet:
    """``path.startswith(prefixes)`` answered with one set lookup per ``/`` in the path."""

    __slots__ = ("_set",)

    def __init__(self, prefixes: Iterable[str]) -> None:
        self._set = frozenset(prefixes)

    def hit(self, path: str) -> bool:
        s = self._set
        j = path.find("/")
        while j != -1:
            if path[:j + 1] in s:
                return True
            j = path.find("/", j + 1)
        return False


def _always(path: str) -> bool:
    return True


@lru_cache(maxsize=4096)
def shared_globset(patterns: tuple[str, ...], home: str, *, forbid: bool) -> GlobSet:
    """One immutable :class:`GlobSet` per distinct pattern list: profiles of one policy share
    their secret denies and most paths, and compiling the regexes dominated profile compiles."""
    return GlobSet(patterns, home, forbid=forbid)
