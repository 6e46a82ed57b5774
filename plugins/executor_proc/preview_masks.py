"""`sandbox profile`'s mask plan: the host is not walked for a glob the run searches
everywhere (issue 32 item 11: with ``allowReadOutside: true`` the preview walked the whole
host, 3 s and 266 MB, and printed where every `.env` on the host lies, other users' included).

A bind of the whole host (``/``) makes every ``**/x`` mandatory deny (``**/.env``,
``**/secrets.json``…) a search of every directory on the host. The preview plans the rest as
the run does — literal denies (``~/.ssh``, ``/etc/shadow``), globs under a fixed prefix
(``/var/lib/docker/**``), every glob in the other binds and the system trees — and names the
host-wide globs instead of their matches: the run plans them (masks.py, bounded at
``MAX_PLAN_DIRS`` directories) and masks every match, so what the preview leaves out is
only the list of paths, never a mask.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from policy_engine.patterns.paths import is_literal, literal_prefix
from policy_engine.sandbox.masks import MaskPlan


def whole_host(bound: Sequence[str]) -> list[str]:
    """The binds that expose the whole host tree (``/``, or a name for it)."""
    return [b for b in bound if (b.rstrip("/") or "/") == "/" or os.path.realpath(b) == "/"]


def host_wide(pattern: str) -> bool:
    """A glob whose search starts at ``/`` (no fixed leading directory)."""
    trimmed = pattern[:-3] if pattern.endswith("/**") else pattern
    return not is_literal(trimmed) and literal_prefix(pattern) == "/"


def plan(bound: Sequence[str], system: Sequence[str], patterns: Sequence[str],
         planner: Callable[[Sequence[str], Sequence[str], Sequence[str]], MaskPlan]
         ) -> tuple[MaskPlan, list[str]]:
    """The preview's plan and the host-wide globs it leaves to the run; ``planner`` is
    ``bounded_plan`` with the profile's home and options bound."""
    wide = whole_host(bound)
    deferred = sorted({p for p in patterns if host_wide(p)}) if wide else []
    if not deferred:
        return planner(bound, system, patterns), []
    rest = [b for b in bound if b not in wide]
    inside = planner(rest, system, patterns)  # every glob in the narrower binds
    # on the host bind: literals and prefixed globs only, walk-free or prefix-bounded
    outside = planner(wide, [], [p for p in patterns if p not in deferred])
    merged = MaskPlan(tuple(sorted({*inside.files, *outside.files})),
                      tuple(sorted({*inside.dirs, *outside.dirs})),
                      inside.dirs_visited + outside.dirs_visited,
                      inside.dirs_listed + outside.dirs_listed,
                      tuple(sorted({*inside.foreign, *outside.foreign})))
    return merged, deferred
