"""proc-bwrap mask planning (issues 27.4, 32.4, 32.11): first call, steady state, planted, soak.

Usage::

    python benchmarks/bench_proc_planning.py --quick   # < 2 min sanity run, prints the tables
    python benchmarks/bench_proc_planning.py           # more samples; updates docs/benchmarks.md

"start": a fresh process per sample builds ``ProcExecutor("bwrap")`` for the benchmark policy of
``bench_proc.py`` (the mandatory denies compiled in). Its start checks the walk of the system
trees the previous run stored (``listing_store``), or walks them, in the background
(``spec.prewarm``); reported are that warm-up, the first call's planning (``build_plan``) once it
is done, and a first call issued at once (which waits for the check, not for the watches), with
the store and without it. "steady": 200 plans in one process, then 200 plans each after a change
in the workspace (a file added, a walked directory deleted), then the same with a new workspace
directory per plan (a service's per-exec artifacts directory). "planted": a writable directory
of ``MAX_DIR_ENTRIES + 1000`` files, then three plans. "soak" (32.11): ``--soak N`` plans with
a new artifacts directory each over a 3,000-directory workspace; the RSS every N/10 plans and
the cache's held bytes.
Overhead over bare bwrap per call is ``bench_proc.py``'s table (same run: run both).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: `benchmarks` lives at the root
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_proc import GRANT, MANIFEST, POLICY  # noqa: E402 - needs the root first
from policy_engine.compiler import compile_files  # noqa: E402 - same
from policy_engine.compiler.loaders import load_grant, load_manifest  # noqa: E402 - same
from policy_engine.model import (  # noqa: E402 - same
    FsCapability,
    ProcExecOp,
    Profile,
    ProfileCapability,
)
from policy_engine.profile import ProfileBuilder  # noqa: E402 - same

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## proc-bwrap mask planning (issue 27 item 4, issue 32 items 4 and 11)"
BEGIN, END = "<!-- bench_proc_planning:begin -->", "<!-- bench_proc_planning:end -->"


def profile_for(tmp: Path, root: Path) -> Profile:
    """The benchmark policy's profile (mandatory denies compiled in), reading ``root``."""
    (tmp / "policy.sbpolicy").write_text(POLICY)
    (tmp / "grant.json").write_text(GRANT)
    (tmp / "manifest.json").write_text(MANIFEST)
    profile = ProfileBuilder(compile_files((tmp / "policy.sbpolicy",))).build(
        load_grant(tmp / "grant.json"), load_manifest(tmp / "manifest.json"))
    caps = tuple(ProfileCapability(kind=k, all_of=(FsCapability(kind=k, paths=(f"{root}/**",)),))
                 for k in ("fs.read", "fs.write"))
    maps = profile.mappings.model_copy(update={"root_fs": str(root), "home": str(root / "home"),
                                               "tmp_dir": str(root / "tmp")})
    return profile.model_copy(update={"capabilities": (*profile.capabilities, *caps),
                                      "mappings": maps})


def _plan_ms(profile: Profile) -> float:
    from plugins.executor_proc.spec import build_plan
    t = time.perf_counter()
    build_plan(profile, ProcExecOp(tool="true"))
    return (time.perf_counter() - t) * 1000


def start_sample(wait_first: bool) -> dict[str, float]:
    """One fresh process's start (run in a child: ``--child-start``). ``*_cpu_ms``: the
    process's CPU time (every thread, the C revalidation's included) since the executor was
    built (its warm-up runs from there), a figure the machine's load inflates less than the
    wall clock; ``*_ms`` from the executor's construction on."""
    with tempfile.TemporaryDirectory(prefix="pe-bench-plan-") as tmp:
        root = Path(tmp) / "ws"
        (root / "src").mkdir(parents=True)
        profile = profile_for(Path(tmp), root)
        from plugins.executor_proc import spec
        from plugins.executor_proc.executor import ProcExecutor
        t = time.perf_counter()
        ex = ProcExecutor("bwrap")
        made = (time.perf_counter() - t) * 1000
        c0 = time.process_time()
        out: dict[str, float] = {"construct_ms": made}
        if wait_first:
            spec.prewarm(wait=True)
            out["warmup_ms"] = (time.perf_counter() - t) * 1000
            out["warmup_cpu_ms"] = (time.process_time() - c0) * 1000
        out["first_plan_ms"] = _plan_ms(profile)
        if not wait_first:
            out["first_plan_cpu_ms"] = (time.process_time() - c0) * 1000
        out["second_plan_ms"] = _plan_ms(profile)
        out["third_plan_ms"] = _plan_ms(profile)
        ex.close()
        return out


def start_rows(samples: int) -> list[str]:
    """Fresh processes with the walk stored by the previous one (a private state directory,
    primed by one run) and with the store off (``POLICY_ENGINE_LISTING_CACHE=0``: every start
    walks, as before the store), alternated."""
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pe-bench-plan-state-") as state:
        stored = {**os.environ, "POLICY_ENGINE_STATE": state}
        stored.pop(listing_store_env(), None)
        none = {**stored, listing_store_env(): "0"}
        runs = [("stored walk", stored), ("no store", none)]
        _child("wait", stored)  # primes the store
        for _ in range(samples):
            for label, env in runs:
                for wait in (True, False):
                    got = _child("wait" if wait else "now", env)
                    for k, v in got.items():
                        rows.setdefault(f"{label}, {'after warm-up' if wait else 'at once'}: "
                                        f"{k}", []).append(v)
    return [f"| start | {k} | {statistics.median(v):.1f} | {len(v)} |" for k, v in rows.items()]


def listing_store_env() -> str:
    from policy_engine.sandbox import listing_store
    return listing_store.DISABLE_ENV


def _child(mode: str, env: dict[str, str]) -> dict[str, float]:
    res = subprocess.run([sys.executable, __file__, "--child-start", mode], capture_output=True,
                         text=True, check=True, cwd=ROOT, env=env)
    got: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return got


def steady_rows(tmp: Path, n: int) -> list[str]:
    """Plans of one workspace: unchanged, then a change in it before every plan (a file added,
    a walked directory deleted: the workspace's own walk is redone in part, the system trees'
    reused; "names listed" counts what was read per plan), then a new artifacts directory per
    plan (a service's per-exec one)."""
    from plugins.executor_proc import spec
    from policy_engine.sandbox import masks
    root = tmp / "ws"
    (root / "src").mkdir(parents=True)
    other = root / "scratch"
    other.mkdir()
    profile = profile_for(tmp, root)
    spec.prewarm(wait=True)
    _plan_ms(profile)

    def run(change: Callable[[int], None] | None) -> tuple[float, float]:
        times, before = [], masks.DEFAULT_CACHE.entries_listed
        for i in range(n):
            if change is not None:
                change(i)
            times.append(_plan_ms(profile))
        return statistics.median(times), (masks.DEFAULT_CACHE.entries_listed - before) / n

    def deleted(i: int) -> None:
        (other / f"d{i}").mkdir()
        _plan_ms(profile)  # walked, so watched, before it goes (untimed)
        (other / f"d{i}").rmdir()

    def fresh(i: int) -> None:
        (root / "artifacts" / f"exec-{i}").mkdir(parents=True)

    rows = [("same workspace, unchanged", run(None)),
            ("a file added in the workspace before each plan",
             run(lambda i: (other / f"f{i}").touch())),
            ("a walked workspace directory deleted before each plan", run(deleted)),
            ("a new directory in the workspace each plan", run(fresh))]
    return [f"| steady | {what} (names listed per plan: {names:.1f}) | {ms:.2f} | {n} |"
            for what, (ms, names) in rows]


def planted_rows(tmp: Path) -> list[str]:
    from policy_engine.sandbox import masks
    root = tmp / "planted"
    huge = root / "out" / "huge"
    huge.mkdir(parents=True)
    profile = profile_for(tmp, root)
    _plan_ms(profile)
    for i in range(masks.MAX_DIR_ENTRIES + 1000):
        os.close(os.open(f"{huge}/f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    out = []
    for i in range(3):
        before = masks.DEFAULT_CACHE.entries_listed
        ms = _plan_ms(profile)
        out.append(f"| planted | plan {i + 1} after {masks.MAX_DIR_ENTRIES + 1000:,} files "
                   f"(names listed: {masks.DEFAULT_CACHE.entries_listed - before:,}) | "
                   f"{ms:.1f} | 1 |")
    shutil.rmtree(huge)
    return out


def soak_rows(tmp: Path, n: int) -> list[str]:
    from policy_engine.sandbox import masks
    root = tmp / "soak"
    for i in range(3000):
        d = root / "src" / f"pkg{i // 100:02d}" / f"mod{i:04d}"
        d.mkdir(parents=True)
        for j in range(5):
            (d / f"file_{j}.py").touch()
    profile = profile_for(tmp, root)
    out = []
    step = max(1, n // 10)
    times: list[float] = []
    for i in range(n):
        # each exec binds its own artifacts directory (a new walk key each call, as a service)
        art = tmp / "artifacts" / f"exec-{i:05d}"
        art.mkdir(parents=True)
        cap = ProfileCapability(kind="fs.write", all_of=(
            FsCapability(kind="fs.write", paths=(f"{art}/**",)),))
        times.append(_plan_ms(profile.model_copy(
            update={"capabilities": (*profile.capabilities, cap)})))
        if (i + 1) % step == 0:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            with open("/proc/self/statm") as fh:
                now = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
            out.append(f"| soak | after {i + 1:,} plans: RSS {now:.0f} MiB (peak {rss:.0f}), "
                       f"cache {masks.DEFAULT_CACHE.held_bytes() / (1 << 20):.1f} MiB | "
                       f"{statistics.median(times[-step:]):.2f} | {step} |")
    return out


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="a sanity run, docs untouched")
    ap.add_argument("--soak", type=int, default=None, help="plans in the soak (10,000 full)")
    ap.add_argument("--child-start", choices=("wait", "now"), help=argparse.SUPPRESS)
    ns = ap.parse_args(args)
    if ns.child_start:
        print(json.dumps(start_sample(ns.child_start == "wait")))
        return 0
    soak = ns.soak if ns.soak is not None else (1000 if ns.quick else 10_000)
    lines = [f"Load average {os.getloadavg()[0]:.2f} at the start, "
             f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}.", "",
             "| phase | what | median ms | samples |", "|---|---|---:|---:|"]
    lines += start_rows(2 if ns.quick else 5)
    with tempfile.TemporaryDirectory(prefix="pe-bench-plan-") as tmp:
        lines += steady_rows(Path(tmp), 50 if ns.quick else 200)
        lines += planted_rows(Path(tmp))
        lines += soak_rows(Path(tmp), soak)
    lines += ["", f"Load average {os.getloadavg()[0]:.2f} at the end."]
    table = "\n".join(lines)
    print(table)
    if not ns.quick:
        text = DOCS.read_text()
        i, j = text.find(BEGIN), text.find(END)
        if i >= 0 and j > i:
            text = text[:i + len(BEGIN)] + "\n" + table + "\n" + text[j:]
        else:
            text = (text.rstrip("\n") + f"\n\n{SECTION}\n\nReproduce with "
                    "`python benchmarks/bench_proc_planning.py` (`--quick` for a sanity run).\n\n"
                    f"{BEGIN}\n{table}\n{END}\n")
        DOCS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
