"""Cold mask plans with `<prefix>/**/<segment>` globs (`**/*.pem`): name-only match vs whole path.

Usage::

    python benchmarks/bench_leaf_globs.py --quick     # 3 rounds; prints only
    python benchmarks/bench_leaf_globs.py --write     # 7 rounds; updates docs/benchmarks.md

A cold plan (a fresh directory cache: every directory listed) of this host's system trees
(``/usr``, ``/etc``, ``/opt``, the Python prefix) and this checkout, with the proc executor's
built-in masks and a blacklist of three leaf globs (``**/*.pem``, ``**/*.key``, ``**/id_*``),
as an ``allowReadOutside`` user's would have. "name only" is ``policy_engine.sandbox.masks``
as it is: each entry's name matched against the glob's last segment, one alternation per
frame; "whole path" is the same planner with that shortcut off (every leaf glob matched as a
regex over the entry's whole path, one glob after another, as before issue 30 item 7). Rounds
of the two interleave, so a change of load hits both; the table gives medians, and checks both
planned the same masks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `benchmarks` lives at the checkout root
    sys.path.insert(0, str(ROOT))
from benchmarks.docs_section import replace_section  # noqa: E402
from plugins.executor_proc.spec import BUILTIN_MASKS  # noqa: E402
from policy_engine.sandbox import masks  # noqa: E402

SECTION = "## Mask planning with leaf globs (issue 30 item 7)"
LEAVES = ("**/*.pem", "**/*.key", "**/id_*")


def _trees() -> list[str]:
    found = [t for t in ("/usr", "/etc", "/opt", sys.prefix, str(ROOT)) if os.path.isdir(t)]
    return sorted({os.path.realpath(t) for t in found})


def _plan(trees: list[str]) -> tuple[masks.MaskPlan, float]:
    masks._MEMO.clear()  # frames are memoised per glob set: each variant builds its own
    started = time.perf_counter()
    plan = masks.plan_masks(trees, [], [*BUILTIN_MASKS, *LEAVES], os.path.expanduser("~"),
                            masks.DirCache())
    return plan, time.perf_counter() - started


def _whole_path() -> Callable[[str, str], masks._Glob]:
    """``masks._compile`` without the leaf shortcut (the planner before it)."""
    compile_ = masks._compile.__wrapped__

    def compile_whole(pattern: str, home: str) -> masks._Glob:
        return dataclasses.replace(compile_(pattern, home), leaf=None)
    return compile_whole


def measure(rounds: int) -> tuple[list[str], dict[str, list[float]], masks.MaskPlan]:
    trees = _trees()
    times: dict[str, list[float]] = {"name only": [], "whole path": []}
    original = masks._compile
    plans: dict[str, masks.MaskPlan] = {}
    try:
        for _ in range(rounds):
            for label in times:
                masks._compile = original if label == "name only" else _whole_path()  # type: ignore[assignment]
                plan, took = _plan(trees)
                times[label].append(took)
                plans[label] = plan
    finally:
        masks._compile = original
    a, b = plans["name only"], plans["whole path"]
    if (set(a.files), set(a.dirs)) != (set(b.files), set(b.dirs)):
        raise SystemExit("the two planners masked different paths")
    return trees, times, a


def render(trees: list[str], times: dict[str, list[float]], plan: masks.MaskPlan) -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = "\n".join(f"| {label} | {statistics.median(t) * 1000:.0f} | {plan.dirs_visited:,} | "
                     f"{len(plan.files) + len(plan.dirs):,} |" for label, t in times.items())
    ratio = statistics.median(times["whole path"]) / statistics.median(times["name only"])
    return (f"{SECTION}\n\nProduced by `python benchmarks/bench_leaf_globs.py --write` (see its "
            f"docstring): cold plans of {', '.join(f'`{t}`' for t in trees)} with the proc "
            f"executor's built-in masks and `{'`, `'.join(LEAVES)}`; medians of "
            f"{len(times['name only'])} interleaved rounds. Load average at the end "
            f"(1/5/15 min): {load}; {sys.version.split()[0]}.\n\n"
            "| planner | median ms | directories | masks |\n|---|---:|---:|---:|\n"
            f"{rows}\n\nThe name-only match is {ratio:.1f}x faster here, with the same masks. "
            "A `**/<segment>` glob is asked only at or beneath its literal prefix, where a path "
            "matches iff its last name matches the segment; the whole-path regex rescanned "
            "every parent segment of every entry, once per glob. An `allowReadOutside` plan "
            "walks the whole host with these globs (docs/testing.md).\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds, print only")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    trees, times, plan = measure(3 if args.quick else 7)
    section = render(trees, times, plan)
    print(section)
    if args.write and not args.quick:
        replace_section(SECTION, section)


if __name__ == "__main__":
    main()
