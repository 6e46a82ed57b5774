"""Time the exact `diff` and `analyze` (issue 29): the examples' policy against a one-rule change,
and one property over a generated 1,000-rule policy.

Both run in-process on this checkout (compile excluded, reported apart), ``--repeat`` times each;
medians are compared with the issue's targets (diff ≤ 2 s, analyze ≤ 10 s). ``--quick`` takes
fewer repeats. ``--write-docs`` puts the table under its own heading in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from docs_section import replace_section  # noqa: E402  (a sibling script)
from scale_policy import scale_policy  # noqa: E402  (a sibling too)

from policy_engine.analysis.difference import diff  # noqa: E402
from policy_engine.analysis.properties import (  # noqa: E402
    can_reach,
    can_read,
    rule_reachable,
)
from policy_engine.compiler import compile_files  # noqa: E402

T = TypeVar("T")
HEADING = "## Exact diff and analyze (issue 29)"
DIFF_TARGET_S, ANALYZE_TARGET_S = 2.0, 10.0


def _median(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    ap.add_argument("--rules", type=int, default=1000)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    repeat = 3 if args.quick else args.repeat
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old_dir, new_dir = Path(tmp, "old"), Path(tmp, "new")
        shutil.copytree(ROOT / "examples" / "policies", old_dir)
        shutil.copytree(ROOT / "examples" / "policies", new_dir)
        net = new_dir / "network.sbpolicy"  # the one-rule change: github-api also takes POST
        net.write_text(net.read_text().replace('methods ["GET", "HEAD"]',
                                               'methods ["GET", "HEAD", "POST"]'))
        t = time.perf_counter()
        old = compile_files([old_dir / "org.sbpolicy"])
        new = compile_files([new_dir / "org.sbpolicy"])
        compile_s = (time.perf_counter() - t) / 2
        s, report = _median(lambda: diff(old, new), repeat)
        n = len(report.changes)
        rows.append(("diff: examples vs github-api + POST", s, DIFF_TARGET_S,
                     f"{n} change(s), {report.cells} classes, "
                     f"{report.decided} decided by both; compile {compile_s:.2f} s each"))
        big = Path(tmp, "big.sbpolicy")
        big.write_text(scale_policy(args.rules).sbpolicy)
        t = time.perf_counter()
        ps = compile_files([big])
        compile_s = time.perf_counter() - t
        wider = Path(tmp, "wider.sbpolicy")
        wider.write_text(big.read_text().replace('"/data/t500/**"', '"/data/t500/**", "/srv/**"'))
        ps2 = compile_files([wider])
        s, big_report = _median(lambda: diff(ps, ps2), repeat)
        rows.append((f"diff: {args.rules} rules vs one path added", s, DIFF_TARGET_S,
                     f"{len(big_report.changes)} change(s), exact: {big_report.exact}"))
        s, ans = _median(lambda: can_read(ps, "/data/t500/**"), repeat)
        rows.append((f"analyze --read /data/t500/** ({args.rules} rules)", s, ANALYZE_TARGET_S,
                     f"{ans.detail[:60]}; compile {compile_s:.2f} s"))
        s, ans = _median(lambda: can_reach(ps, "svc502.example.com"), repeat)
        rows.append((f"analyze --reach svc502.example.com ({args.rules} rules)", s,
                     ANALYZE_TARGET_S, f"{ans.detail[:60]}"))
        s, ans = _median(lambda: can_read(ps, "/data/t500/private/**"), repeat)
        rows.append((f"analyze --read /data/t500/private/** ({args.rules} rules, a proof)", s,
                     ANALYZE_TARGET_S, f"{ans.detail[:70]}"))
        s, ans = _median(lambda: rule_reachable(ps, "r500"), repeat)
        rows.append((f"analyze --rule r500 ({args.rules} rules)", s, ANALYZE_TARGET_S,
                     f"{ans.detail[:70]}"))
    load = os.getloadavg()[0]
    lines = [HEADING, "",
             f"`python3 benchmarks/bench_diff.py{' --quick' if args.quick else ''}` — "
             f"{datetime.now(UTC):%Y-%m-%d}, 2 cores shared, load average {load:.1f}; "
             f"median of {repeat}, in-process, compile excluded.", "",
             "| what | median | target | result |", "|---|---|---|---|"]
    for name, s, target, note in rows:
        ok = "ok" if s <= target else "**over**"
        lines.append(f"| {name} | {s:.2f} s | ≤ {target:.0f} s ({ok}) | {note} |")
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write_docs:
        replace_section(HEADING, section)


if __name__ == "__main__":
    main()
