"""Conditions that read only the ``profile`` view, evaluated once per view instead of per call.

A consent rule such as ``profile.safety == "High" || "Write" in profile.side_effects`` depends
on the profile alone, and the guard builds that view once per compiled profile (shared by every
per-call copy of a grant shape, see ``guard.shapes``) and never lets a caller's context replace
it. So its outcome is a function of that one dict object: remembered by the object's identity
(the entry keeps the object, so its id cannot be reused while the entry lives).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Outcome = tuple[bool, str | None]

PROFILE_ONLY = frozenset({"profile"})
_SIZE = 4096


def profile_only(run: Callable[[Mapping[str, object]], Outcome]
                 ) -> Callable[[Mapping[str, object]], Outcome]:
    """``run`` remembered per ``profile`` view object (for a condition reading nothing else)."""
    memo: dict[int, tuple[object, Outcome]] = {}

    def remembered(ctx: Mapping[str, object]) -> Outcome:
        view = ctx.get("profile")
        if view is None:
            return run(ctx)
        hit = memo.get(id(view))
        if hit is not None and hit[0] is view:
            return hit[1]
        outcome = run(ctx)
        if len(memo) >= _SIZE:  # a bound, not an LRU: a miss costs one evaluation
            memo.clear()
        memo[id(view)] = (view, outcome)
        return outcome

    return remembered
