"""proc.exec overhead: bare subprocess, bare bwrap, the proc-bwrap executor, the full orchestrator.

Usage::

    python benchmarks/bench_proc.py           # full run (~15 s); updates docs/benchmarks.md
    python benchmarks/bench_proc.py --quick   # < 60 s sanity run; prints the table only
    python benchmarks/bench_proc.py --quick --baseline /other/checkout   # before/after, interleaved
    BENCH_ENGINE_PATH=/other/checkout python benchmarks/bench_proc.py --quick  # "before" alone

``--baseline``: two worker processes, one importing this checkout's engine and one the other
checkout's, take turns call by call (bare bwrap, executor, orchestrator in each), so both see
the same load; each row's "over bare bwrap" is against its own process's bare bwrap. Never
writes docs/benchmarks.md, nor does a run with ``BENCH_ENGINE_PATH``.

Every row runs the same command (``true`` by default) in one process, interleaved round by round
so a load shift hits every row alike, with an untimed pause (``--gap-ms``, 20 ms) before each call
so one row's background work (refilling its held launchers) does not land on the next row.
"bare bwrap" is the exact bwrap command line the executor
builds for that call (binds, masks, ``--unshare-all``, ``--die-with-parent``…), run directly with
``subprocess.run``; the executor and orchestrator rows add, on top of it, whatever the default
configuration adds (native launcher with Landlock + seccomp, per-exec cgroups, evidence, budget).
The breakdown rows switch single layers off to show where the remaining time goes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the engine measured: this checkout, or another one's code ("before")
ENGINE = Path(os.environ.get("BENCH_ENGINE_PATH") or ROOT).resolve()
sys.path.insert(0, str(ENGINE))  # first: before an installed copy of the engine

from plugins.executor_proc import bwrap, spec  # noqa: E402 - needs the checkout root on sys.path
from plugins.executor_proc.executor import ProcExecutor, ProcOptions  # noqa: E402 - same
from plugins.executor_proc.spec import build_plan  # noqa: E402 - same
from policy_engine.compiler import compile_files  # noqa: E402 - same
from policy_engine.compiler.loaders import load_grant, load_manifest  # noqa: E402 - same
from policy_engine.config import EngineConfig  # noqa: E402 - same
from policy_engine.executor import ExecContext  # noqa: E402 - same
from policy_engine.model import ProcExecOp  # noqa: E402 - same
from policy_engine.orchestrator import Orchestrator  # noqa: E402 - same

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Process execution overhead (issue: Controlled execution)"
TARGET_MS = 2.0

POLICY = """\
policy "bench/proc" version "1.0.0"
defaults {
  timeout 30s
  network off
}
permit "true" proc.exec  tool "true"  args []
permit "git-version" proc.exec  tool "git"  args ["--version"]
"""
GRANT = """{"tenant": "bench", "subject_id": "agent:bench", "tool_name": "shell",
 "call_id": "bench-1", "capabilities": [{"kind": "proc.exec", "tool": "true"},
 {"kind": "proc.exec", "tool": "git"}], "expires_at": 4102444800000,
 "budget": {"calls": 100000000, "cpu_ms": 100000000},
 "consent": {"granted_by": "user:bench", "granted_at": 1790000000000,
             "expires_at": 4102444800000}}"""
MANIFEST = """{"name": "shell", "version": "1.0.0", "permissions": [
 {"kind": "proc.exec", "tool": "true"}, {"kind": "proc.exec", "tool": "git"}],
 "side_effects": ["Process"], "safety_class": "Low"}"""


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    what: str
    run: Callable[[], None]


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"bench_proc: {what}")


def build_rows(tmp: Path, argv: list[str], *,
               breakdown: bool) -> tuple[list[Row], list[Orchestrator]]:
    (tmp / "policy.sbpolicy").write_text(POLICY)
    (tmp / "grant.json").write_text(GRANT)
    (tmp / "manifest.json").write_text(MANIFEST)
    policyset = compile_files((tmp / "policy.sbpolicy",))
    grant = load_grant(tmp / "grant.json")
    manifest = load_manifest(tmp / "manifest.json")
    op = ProcExecOp(tool=argv[0], args=tuple(argv[1:]))
    config = EngineConfig(state_dir=tmp / "state", revocation="memory")
    orch = Orchestrator(policyset, config=config)
    extra: list[Orchestrator] = [orch]
    profile = orch.builder.build(grant, manifest)
    probe = orch.run(grant, manifest, op)
    _check(probe.result.ok, f"the orchestrator refused the benchmark call: {probe.result}")
    _check(probe.result.out.get("exit_code") == 0, f"`{argv}` failed: {probe.result.out}")

    plan = build_plan(profile, op)
    bw = shutil.which("bwrap")
    _check(bw is not None, "bwrap is not installed")
    assert bw is not None
    bare_bwrap = bwrap.build_argv(bw, plan, inner=plan.argv, launcher_src=None)
    exe = shutil.which(argv[0]) or argv[0]

    def subprocess_run(cmd: list[str], env: dict[str, str] | None) -> Callable[[], None]:
        def go() -> None:
            res = subprocess.run(cmd, capture_output=True, env=env, cwd="/", check=False)
            if res.returncode != 0:
                raise SystemExit(f"bench_proc: {cmd[:3]}… exited {res.returncode}: {res.stderr!r}")
        return go

    def executor(ex: ProcExecutor) -> Callable[[], None]:
        def go() -> None:
            ctx = ExecContext(profile=profile, deadline=time.monotonic() + 30)
            res = ex.execute(ctx, op)
            if res.out["exit_code"] != 0:
                raise SystemExit(f"bench_proc: executor run failed: {res.out}")
        return go

    def full() -> None:
        res = orch.run(grant, manifest, op)
        if not res.result.ok:
            raise SystemExit(f"bench_proc: orchestrator run failed: {res.result}")

    default_ex = ProcExecutor("bwrap")
    # per-call cost only: until the system trees' mask warm-up has watched every directory a
    # plan waits for it (bench_proc_planning.py measures that first-call cost; under load the
    # warm-up outlasts a quick run's warm-up calls and its wait would land in every row)
    spec.prewarm(wait=True)
    rows = [
        Row("bare subprocess", f"`subprocess.run([{exe!r}])`",
            subprocess_run([exe, *argv[1:]], dict(plan.env))),
        Row("bare bwrap", "the executor's bwrap argv, `subprocess.run`",
            subprocess_run(bare_bwrap, {})),
        Row("proc-bwrap executor", "default: launcher (Landlock + seccomp) + cgroups",
            executor(default_ex)),
        Row("full orchestrator", "profile, guard, budget (SQLite), evidence (JSONL), executor",
            full),
    ]
    if breakdown:
        lean = Orchestrator(policyset, config=EngineConfig(
            state_dir=tmp / "state-lean", revocation="memory",
            options={"proc": {"layer2": False}}))
        extra.append(lean)

        def lean_run() -> None:
            res = lean.run(grant, manifest, op)
            if not res.result.ok:
                raise SystemExit(f"bench_proc: orchestrator run failed: {res.result}")

        rows += [
            Row("orchestrator, no layer 2", "as full, `layer2: false` (bwrap + cgroups only)",
                lean_run),
            Row("executor, no layer 2", "cgroups on, launcher off",
                executor(ProcExecutor("bwrap", ProcOptions(layer2=False)))),
            Row("executor, no cgroups", "launcher on, cgroups off (rlimits only)",
                executor(ProcExecutor("bwrap", ProcOptions(cgroups=False)))),
            Row("executor, bwrap only", "launcher off, cgroups off",
                executor(ProcExecutor("bwrap", ProcOptions(layer2=False, cgroups=False)))),
        ]
    return rows, extra


def measure(rows: list[Row], iterations: int, warmup: int,
            gap_s: float) -> dict[str, list[float]]:
    for row in rows:
        for _ in range(warmup):
            row.run()
    samples: dict[str, list[float]] = {r.name: [] for r in rows}
    gc.collect()
    for _ in range(iterations):  # interleaved: one sample of every row per round
        for row in rows:
            time.sleep(gap_s)  # untimed: the previous row's background work settles first
            t0 = time.perf_counter()
            row.run()
            samples[row.name].append((time.perf_counter() - t0) * 1000)
    return samples


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1]


def render(rows: list[Row], samples: dict[str, list[float]], argv: list[str],
           iterations: int, gap_ms: float) -> tuple[str, bool]:
    base = statistics.median(samples["bare bwrap"])
    lines = [f"`{' '.join(argv)}`, {iterations} interleaved iterations per row after warm-up, "
             f"{gap_ms:g} ms untimed pause before each call; "
             f"{platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
             f"Python {platform.python_version()}, load average "
             f"{os.getloadavg()[0]:.2f}, {dt.date.today().isoformat()}.", "",
             "| row | what | median ms | p90 ms | median over bare bwrap |",
             "|---|---|---:|---:|---:|"]
    for row in rows:
        xs = samples[row.name]
        med = statistics.median(xs)
        over = "—" if row.name == "bare bwrap" else f"{med - base:+.2f} ms"
        lines.append(f"| {row.name} | {row.what} | {med:.2f} | {p90(xs):.2f} | {over} |")
    executor = statistics.median(samples["proc-bwrap executor"]) - base
    full = statistics.median(samples["full orchestrator"]) - base
    met = executor <= TARGET_MS
    lines += ["", f"Target (issue 27 item 4: proc-bwrap ≤ {TARGET_MS:g} ms over bare bwrap at the "
              f"median, same run): **{'met' if met else 'not met'}** ({executor:+.2f} ms). The "
              f"orchestrator's own steps (guard, evidence begin and end, budget slot) add "
              f"{full - executor:+.2f} ms on top ({full:+.2f} ms over bare bwrap in all)."]
    return "\n".join(lines), met


def update_docs(table: str) -> None:
    """Replace the table between the markers of our section; append the section if absent.
    Other sections, and the prose around our table, belong to people and are left alone.
    """
    begin, end = "<!-- bench_proc:begin -->", "<!-- bench_proc:end -->"
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    i, j = text.find(begin), text.find(end)
    if i >= 0 and j > i:
        text = text[:i + len(begin)] + "\n" + table + "\n" + text[j:]
    elif SECTION in text:
        raise SystemExit(f"bench_proc: {DOCS} has the section but no table markers")
    else:
        text = (text.rstrip("\n") + f"\n\n{SECTION}\n\nReproduce with "
                "`python benchmarks/bench_proc.py` (`--quick` for a sanity run).\n\n"
                f"{begin}\n{table}\n{end}\n")
    DOCS.write_text(text)


AB_ROWS = ("bare bwrap", "proc-bwrap executor", "full orchestrator")


def worker(argv: list[str]) -> int:
    """``--baseline``'s worker: builds the rows with ``ENGINE``'s code, then runs the row named
    on each stdin line once and prints its milliseconds."""
    with tempfile.TemporaryDirectory(prefix="pe-bench-proc-") as tmp:
        rows, orchs = build_rows(Path(tmp), argv, breakdown=False)
        try:
            spec.prewarm(wait=True)  # a baseline without the wait in build_rows
            run = {r.name: r.run for r in rows}
            for fn in run.values():
                for _ in range(5):
                    fn()
            print("ready", flush=True)
            for line in sys.stdin:
                t0 = time.perf_counter()
                run[line.strip()]()
                print(f"{(time.perf_counter() - t0) * 1000:.4f}", flush=True)
        finally:
            for orch in orchs:
                orch.close()
    return 0


def baseline(other: str, argv: list[str], iterations: int, gap_s: float) -> None:
    """Interleave this checkout and ``other`` call by call; print both tables' medians."""
    trees = {"baseline": str(Path(other).resolve()), "this": str(ROOT)}
    procs = {name: subprocess.Popen(
        [sys.executable, __file__, "--worker", *argv], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tree,
        env={**os.environ, "BENCH_ENGINE_PATH": tree}) for name, tree in trees.items()}
    samples: dict[tuple[str, str], list[float]] = {(n, r): [] for n in procs for r in AB_ROWS}
    try:
        for name, proc in procs.items():
            assert proc.stdout is not None
            _check(proc.stdout.readline().strip() == "ready", f"the {name} worker did not start")
        for _ in range(iterations):
            for name, proc in procs.items():
                assert proc.stdin is not None
                assert proc.stdout is not None
                for row in AB_ROWS:
                    time.sleep(gap_s)
                    proc.stdin.write(row + "\n")
                    proc.stdin.flush()
                    samples[(name, row)].append(float(proc.stdout.readline()))
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(60)
    with open("/proc/self/mountinfo") as fh:
        mounts = sum(1 for _ in fh)
    print(f"`{' '.join(argv)}`, {iterations} interleaved rounds, {gap_s * 1000:g} ms untimed "
          f"pause before each call; load average {os.getloadavg()[0]:.2f}, {mounts} mounts; "
          f"baseline `{trees['baseline']}`, this `{trees['this']}`.\n")
    print("| row | baseline median ms | this median ms | baseline over bare | this over bare |")
    print("|---|---:|---:|---:|---:|")
    base = {n: statistics.median(samples[(n, "bare bwrap")]) for n in procs}
    for row in AB_ROWS:
        med = {n: statistics.median(samples[(n, row)]) for n in procs}
        over = {n: "—" if row == "bare bwrap" else f"{med[n] - base[n]:+.2f} ms" for n in procs}
        print(f"| {row} | {med['baseline']:.2f} | {med['this']:.2f} | {over['baseline']} | "
              f"{over['this']} |")


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="a < 60 s sanity run, docs untouched")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--no-breakdown", action="store_true", help="only the four main rows")
    ap.add_argument("--no-docs", action="store_true", help="print only")
    ap.add_argument("--gap-ms", type=float, default=20.0,
                    help="untimed pause before each call (0: back to back)")
    ap.add_argument("--baseline", metavar="CHECKOUT",
                    help="interleave with another checkout's engine (before/after); no docs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("argv", nargs="*", default=["true"], help="command (default: true)")
    ns = ap.parse_args(args)
    if ns.worker:
        return worker(list(ns.argv))
    iterations = ns.iterations or (40 if ns.quick else 300)
    if ns.baseline:
        baseline(ns.baseline, list(ns.argv), iterations, ns.gap_ms / 1000)
        return 0
    with tempfile.TemporaryDirectory(prefix="pe-bench-proc-") as tmp:
        rows, orchs = build_rows(Path(tmp), list(ns.argv), breakdown=not ns.no_breakdown)
        try:
            samples = measure(rows, iterations, warmup=3 if ns.quick else 10,
                              gap_s=ns.gap_ms / 1000)
        finally:
            for orch in orchs:
                orch.close()
    table, met = render(rows, samples, list(ns.argv), iterations, ns.gap_ms)
    print(table)
    if not ns.quick and not ns.no_docs and ROOT.resolve() == ENGINE:
        update_docs(table)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
