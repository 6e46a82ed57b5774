"""The cgroup reads a proc call makes on the engine thread after its tool exits.

Usage::

    python benchmarks/bench_cgroup_reads.py            # 500 groups, prints the medians
    python benchmarks/bench_cgroup_reads.py -n 100     # fewer

For each of ``-n`` pooled groups (``CgroupPool``, as the proc executors get them) a short
process runs inside it and exits, then the sequence ``_run`` makes is timed read by read with
``perf_counter``: ``kill_all`` (the group is empty by then: one read of ``cgroup.procs``),
``memory_peak``, ``oom_kills``, ``cpu_ms``. Prints the median of each and of the sum, in µs.
Needs a writable cgroup hierarchy (root, or a delegated v2 subtree). Quiet machine only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plugins.executor_proc import cgroups  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=500)
    n = ap.parse_args().n
    pool = cgroups.CgroupPool(2)
    if pool.version is None:
        sys.exit("no writable cgroup hierarchy here")
    names = ("kill_all", "memory_peak", "oom_kills", "cpu_ms")
    times: dict[str, list[float]] = {k: [] for k in (*names, "total")}
    try:
        for _ in range(n):
            cg = pool.acquire(64, 256 << 20, 1.0)
            assert cg is not None
            files = cg.procs_files
            # the child joins the group itself (as the launchers do) and exits at once
            subprocess.run(["/bin/sh", "-c", "for f; do echo $$ > $f; done; :", "sh", *files],
                           check=True)
            t = [time.perf_counter()]
            cg.kill_all()
            t.append(time.perf_counter())
            cg.memory_peak()
            t.append(time.perf_counter())
            cg.oom_kills()
            t.append(time.perf_counter())
            cg.cpu_ms()
            t.append(time.perf_counter())
            for i, k in enumerate(names):
                times[k].append(t[i + 1] - t[i])
            times["total"].append(t[-1] - t[0])
            pool.release(cg)
            time.sleep(0.004)  # let the pool's thread remove it and make the next off this path
    finally:
        pool.close()
    load = os.getloadavg()[0]
    print(f"cgroup {pool.version}, {n} groups, load {load:.2f}; medians in µs")
    for k, v in times.items():
        print(f"  {k:<12} {statistics.median(v) * 1e6:8.1f}")


if __name__ == "__main__":
    main()
