"""The cgroup reads a proc call makes on the engine thread after its tool exits.

Usage::

    python benchmarks/bench_cgroup_reads.py              # 500 groups, prints the medians
    python benchmarks/bench_cgroup_reads.py -n 100       # fewer
    python benchmarks/bench_cgroup_reads.py --executor   # the same reads inside proc-bwrap calls
    BENCH_ENGINE_PATH=/other/checkout python benchmarks/bench_cgroup_reads.py   # "before"

For each of ``-n`` pooled groups (``CgroupPool``, as the proc executors get them) a short
process runs inside it and exits, then the sequence ``_run`` makes is timed read by read with
``perf_counter``: ``kill_all`` (the group is empty by then: one read of ``cgroup.procs``),
``memory_peak``, ``oom_kills``, ``cpu_ms``. Prints the median of each and of the sum, in µs.
``--executor``: ``-n`` real calls of ``true`` through a proc-bwrap ``ProcExecutor`` (held
launchers, pooled groups, bench_proc.py's policy), each of the four methods timed where the
call's thread runs it (the pool's thread also runs ``kill_all`` when it removes a group: not
counted). Needs a writable cgroup hierarchy (root, or a delegated v2 subtree). Quiet machine only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the engine measured: this checkout, or another one's code ("before")
sys.path.insert(0, str(Path(os.environ.get("BENCH_ENGINE_PATH") or ROOT).resolve()))

from plugins.executor_proc import cgroups  # noqa: E402 - needs the checkout root on sys.path

NAMES = ("kill_all", "memory_peak", "oom_kills", "cpu_ms")


def in_pool(n: int) -> tuple[str, dict[str, list[float]]]:
    """The reads of ``n`` pooled groups a short process ran in, timed one by one."""
    pool = cgroups.CgroupPool(2)
    if pool.version is None:
        sys.exit("no writable cgroup hierarchy here")
    times: dict[str, list[float]] = {k: [] for k in (*NAMES, "total")}
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
            for i, k in enumerate(NAMES):
                times[k].append(t[i + 1] - t[i])
            times["total"].append(t[-1] - t[0])
            pool.release(cg)
            time.sleep(0.004)  # let the pool's thread remove it and make the next off this path
    finally:
        pool.close()
    return f"cgroup {pool.version}, {n} pooled groups", times


def in_executor(n: int) -> tuple[str, dict[str, list[float]]]:
    """The same four reads as ``n`` proc-bwrap calls make them, on the calling thread."""
    import tempfile

    from bench_proc import GRANT, MANIFEST, POLICY  # the same call as bench_proc.py's rows

    from plugins.executor_proc.executor import ProcExecutor
    from policy_engine.compiler import compile_files
    from policy_engine.compiler.loaders import load_grant, load_manifest
    from policy_engine.executor import ExecContext
    from policy_engine.model import ProcExecOp
    from policy_engine.profile import ProfileBuilder

    caller = threading.get_ident()
    spent: dict[str, float] = dict.fromkeys(NAMES, 0.0)

    def timed(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if threading.get_ident() == caller:
                    spent[name] += time.perf_counter() - t0
        return wrapper

    for name in NAMES:
        setattr(cgroups.ExecCgroup, name, timed(name, getattr(cgroups.ExecCgroup, name)))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "p.sbpolicy").write_text(POLICY)
        (tmp / "g.json").write_text(GRANT)
        (tmp / "m.json").write_text(MANIFEST)
        profile = ProfileBuilder(compile_files((tmp / "p.sbpolicy",))).build(
            load_grant(tmp / "g.json"), load_manifest(tmp / "m.json"))
    ex = ProcExecutor("bwrap")
    times: dict[str, list[float]] = {k: [] for k in (*NAMES, "total")}
    try:
        for i in range(n + 5):
            for k in spent:
                spent[k] = 0.0
            res = ex.execute(ExecContext(profile=profile, deadline=time.monotonic() + 30),
                             ProcExecOp(tool="true"))
            if res.out["exit_code"] != 0:
                sys.exit(f"the call failed: {res.out}")
            if i >= 5:  # the first calls spawn the held launchers and warm the masks
                for k, v in spent.items():
                    times[k].append(v)
                times["total"].append(sum(spent.values()))
            time.sleep(0.02)  # untimed, as bench_proc.py: the call's background work ends
    finally:
        ex.close()
    return f"{n} proc-bwrap calls of `true`", times


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--executor", action="store_true", help="inside real proc-bwrap calls")
    args = ap.parse_args()
    what, times = (in_executor if args.executor else in_pool)(args.n)
    print(f"{what}, load {os.getloadavg()[0]:.2f}, engine {sys.path[0]}; medians in µs")
    for k, v in times.items():
        print(f"  {k:<12} {statistics.median(v) * 1e6:8.1f}")


if __name__ == "__main__":
    main()
