"""Mask planning time (issue 10 item 6): where the mandatory denies must be masked in a sandbox.

Usage::

    python benchmarks/mask_planning.py            # prints the table (medians of 15 plans)
    python benchmarks/mask_planning.py --rounds 5

Two workspaces: the demo (``examples/workspace``) and a synthetic repository of a
150,000-file ``node_modules`` plus a 20,000-object ``.git`` (``benchmarks/repo_tree.py``, built
in a temporary directory). "cold" is the first plan of a fresh directory cache (every directory
listed and watched); "warm" is the steady state of a long-running engine on an unchanged tree
(inotify reports no change: the last walk is reused); "changed" adds and removes one file deep
in the tree before each plan (inotify names the changed directory: only it is walked again);
"full re-walk" is what a plan costs when inotify cannot say (no inotify, a
watched directory moved or deleted, a queue overflow, > 64 changed directories): one ``lstat``
per directory, listings reused by ctime.
The planned patterns are exactly the proc executor's: the built-in masks, the host runtime
directories and the seed 003 mandatory denies (``build_plan`` of a profile reading the tree).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: `benchmarks` lives at the root
    sys.path.insert(0, str(ROOT))

from benchmarks.repo_tree import make_repo  # noqa: E402 - needs the checkout root on sys.path
from plugins.executor_proc import spec  # noqa: E402 - same
from policy_engine.compiler.builtins import MANDATORY_DENY_PATHS  # noqa: E402 - same
from policy_engine.sandbox import masks  # noqa: E402 - same

_SYSTEM = [p for p in spec.SYSTEM_RO if Path(p).exists()]


def _patterns() -> list[str]:
    return [*spec.BUILTIN_MASKS, *(f"{d}/**" for d in masks.RUNTIME_DIRS),
            *masks.RUNTIME_GLOBS, *MANDATORY_DENY_PATHS]


def _time(root: Path, rounds: int, mode: str) -> tuple[float, int, int]:
    """Median milliseconds of ``rounds`` plans, with the files masked and the dirs visited."""
    cache = masks.DirCache(watch=mode != "full re-walk")
    home = str(root / "home")
    plan = masks.plan_masks([str(root)], _SYSTEM, _patterns(), home, cache)
    deepest = max((d for d, _, _ in os.walk(root)), key=lambda d: d.count("/"))
    samples = []
    for i in range(rounds):
        if mode == "cold":
            cache = masks.DirCache()
        elif mode == "changed":
            touched = Path(deepest) / f".bench-{i}"
            touched.write_text("x")
            touched.unlink()
        t0 = time.perf_counter()
        plan = masks.plan_masks([str(root)], _SYSTEM, _patterns(), home, cache)
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), len(plan.files), plan.dirs_visited


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pe-bench-mask-"))
    try:
        big = make_repo(tmp / "repo")
        time.sleep(masks.RACY_NS / 1e9 + 0.2)  # fresh directories are re-listed until then
        demo = ROOT / "examples" / "workspace"
        print("| workspace | cache | median ms | dirs visited | masks |")
        print("|---|---|---:|---:|---:|")
        for label, root in (("demo (examples/workspace)", demo),
                            ("150k node_modules + 20k .git", big)):
            for mode in ("cold", "warm", "changed", "full re-walk"):
                ms, found, dirs = _time(root, args.rounds, mode)
                print(f"| {label} | {mode} | {ms:.2f} | {dirs} | {found} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
