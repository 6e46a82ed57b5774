"""The console's evidence pages on a large log: each page's query over 1,000,000 indexed calls.

Usage::

    python benchmarks/bench_console.py            # 1,000,000 calls
    python benchmarks/bench_console.py --quick    # 100,000 calls

The index is filled through its own ingestion path (``EvidenceIndex.sync`` over a chained JSONL
log the script writes: 2 records per call), timed as "ingest", then each page query the console
runs is timed (median of 15 after one warm-up): the first page, a tenant's page, a deep page
reached by cursor, a filter on decision + code, a rule, a subject, a time range, one call's page
(its records re-read from the log and their chain checked) and the charts' counts for a day.
The goal (issue 31): ≤ 300 ms per page on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from policy_engine.console.index import EvidenceIndex, JsonlSource  # noqa: E402
from policy_engine.evidence.chain import chained, next_link  # noqa: E402

START_MS = 1_790_000_000_000
TENANTS = 20
CODES = ("SANDBOX.CAPABILITY_BLOCKED", "SANDBOX.PERMISSION_DENY", "QUOTA.BUDGET_EXCEEDED")


def write_log(path: Path, calls: int) -> None:
    """A chained JSONL log of ``calls`` calls spread over 30 days."""
    step = (30 * 86_400_000) // calls
    last: bytes | None = None
    with path.open("wb") as fh:
        for i in range(calls):
            env = f"{i:032x}"
            denied = i % 4 == 0
            ts = START_MS + i * step
            for rec in (
                {"type": "begin", "envelope_id": env, "tenant": f"t{i % TENANTS}",
                 "subject_id": f"agent:{i % 500}", "tool_name": f"tool{i % 30}",
                 "capability": f"fs.read:/workspace/src/{i % 1000}.py", "produced_at_ms": ts},
                {"type": "end", "envelope_id": env, "status": "denied" if denied else "ok",
                 "decision": "deny" if denied else "allow",
                 "error_code": CODES[i % 3] if denied else None,
                 "rule": {"id": f"rule{i % 200}", "file": "/p.sbpolicy", "line": 1,
                          "column": 1},
                 "finished_at_ms": ts + 3, "sandbox_backend": ("fs", "proc-bwrap", "docker")[i % 3],
                 "sandbox_latency_ms": float(i % 97)},
            ):
                seq, prev = next_link(last)
                raw = chained(json.dumps(rec, separators=(",", ":")).encode(), seq, prev)
                fh.write(raw + b"\n")
                last = raw


def median_ms(fn: Callable[[], Any], runs: int = 15) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 calls")
    args = parser.parse_args()
    calls = 100_000 if args.quick else 1_000_000
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        log = Path(tmp) / "evidence.jsonl"
        t0 = time.perf_counter()
        write_log(log, calls)
        written = time.perf_counter() - t0
        index = EvidenceIndex(Path(tmp) / "index.sqlite", [JsonlSource(log)])
        t0 = time.perf_counter()
        while index.sync(batch=50_000):
            pass
        ingest = time.perf_counter() - t0
        first = index.page({}, size=50)
        deep_cursor = first.next_cursor
        for _ in range(200):  # 10,000 calls down: a cursor deep in the log
            nxt = index.page({}, cursor=deep_cursor, size=50).next_cursor
            deep_cursor = nxt or deep_cursor
        day = START_MS + 15 * 86_400_000
        one = first.rows[0]["envelope_id"]
        rows = {
            "first page (50 newest)": lambda: index.page({}, size=50),
            "one tenant's page": lambda: index.page({"tenant": "t7"}, size=50),
            "page 201 by cursor": lambda: index.page({}, cursor=deep_cursor, size=50),
            "decision = deny, code": lambda: index.page(
                {"decision": "deny", "code": "SANDBOX.PERMISSION_DENY"}, size=50),
            "one rule": lambda: index.page({"rule_id": "rule42"}, size=50),
            "one subject in one tenant": lambda: index.page(
                {"tenant": "t7", "subject": "agent:7"}, size=50),
            "a time range (one day)": lambda: index.page({}, since=day,
                                                         until=day + 86_400_000, size=50),
            "one call (re-read + chain check)": lambda: index.call(one, None),
            "charts, one day": lambda: index.stats({}, since=day, until=day + 86_400_000),
            "charts, one tenant's day": lambda: index.stats({"tenant": "t7"}, since=day,
                                                            until=day + 86_400_000),
        }
        print(f"calls: {calls:,}  log: {log.stat().st_size / 1e6:.0f} MB written in "
              f"{written:.1f} s  ingest: {ingest:.1f} s ({calls * 2 / ingest:,.0f} records/s)  "
              f"load: {os.getloadavg()[0]:.2f}")
        print("| page query | median ms |")
        print("|---|---|")
        for name, fn in rows.items():
            print(f"| {name} | {median_ms(fn):.1f} |")


if __name__ == "__main__":
    main()
