"""A new grant on every call: profile build + decision per call, ours beside cedarpy, one run.

Usage::

    python benchmarks/bench_new_grant.py           # full run (~1 min); updates docs/benchmarks.md
    python benchmarks/bench_new_grant.py --quick   # sanity run; prints the table only
    python benchmarks/bench_new_grant.py --memory  # also 10,000 cached profiles (RSS)
    BENCH_ENGINE_PATH=/other/checkout python benchmarks/bench_new_grant.py --quick  # "before"

Grants are per call (``call_id``), so a real caller builds a profile for a grant it never sent
before. Each timed call here takes a grant object no call has used (a distinct ``call_id`` and
``expires_at``), builds its profile against the cached policy and decides one ``fs.read``.
Scenarios: the example org policy with the shell tool, and a generated 1,000-rule policy with a
4-capability grant. cedarpy decides the same read with its policy set parsed once and its request
and entities (principal with the grant's attributes, the file) passed as JSON per call, i.e.
parsed on every call. Ours is timed twice: with the default guard (which also looks at what the
fs executor will find at the path: a regular file of an acceptable size, so a dry run answers as
the run does) and with the guard ``bench_guard.py`` times against the peers (symlinks resolved,
no disk facts: the policy decision cedarpy makes). Rows report the median over repeats of the
per-call mean.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: `benchmarks` lives at the root
    sys.path.insert(0, str(ROOT))
ENGINE_ENV = "BENCH_ENGINE_PATH"
"""Another checkout whose engine to measure (a "before" run): its path goes first."""
if os.environ.get(ENGINE_ENV):
    sys.path.insert(0, os.environ[ENGINE_ENV])

from benchmarks.bench_guard import machine_info as _machine_info  # noqa: E402
from benchmarks.docs_section import replace_section  # noqa: E402
from benchmarks.scale_policy import (  # noqa: E402 - needs the checkout root on sys.path first
    CEDAR_SECRETS,
    ScalePolicy,
    scale_policy,
)
from policy_engine.compiler import compile_files  # noqa: E402
from policy_engine.guard import Guard  # noqa: E402
from policy_engine.model import ExecOp, Grant, Manifest  # noqa: E402
from policy_engine.profile import ProfileBuilder, ProfileCache  # noqa: E402

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## A new grant per call (issue: Speed and memory)"
EXAMPLES = ROOT / "examples"
HOME = "/home/agent"
NOW_MS = 1_795_000_000_000
TARGET_EXAMPLE_US = 40.0
TARGET_SCALE_US = 150.0
TARGET_CEDAR_RATIO = 3.0


@dataclass(frozen=True, slots=True)
class Cfg:
    repeat: int
    per_repeat: int


FULL = Cfg(repeat=21, per_repeat=400)
QUICK = Cfg(repeat=7, per_repeat=200)
# Every row, ours and cedarpy's, runs the same number of calls per repeat (before 2026-11-24
# ours ran half as many, and the collector's pass before each repeat cost it more per call).


def timed(fn: Callable[[int], object], cfg: Cfg, *, gc_on: bool = False) -> float:
    """Median over repeats of the per-call mean in µs; ``fn(i)`` runs call ``i`` (never reused).

    As ``timeit`` (and ``bench_guard.py``) does, the collector is off inside a repeat and runs
    between repeats; ``gc_on`` keeps it on (its cost then depends on everything else the
    process holds, here thousands of prepared grants).
    """
    means = []
    i = 0
    for _ in range(cfg.repeat):
        gc.collect()
        if not gc_on:
            gc.disable()
        try:
            t0 = time.perf_counter_ns()
            for _ in range(cfg.per_repeat):
                fn(i)
                i += 1
            means.append((time.perf_counter_ns() - t0) / cfg.per_repeat / 1000)
        finally:
            gc.enable()
    BEST[len(BEST)] = min(means)
    return statistics.median(means)


BEST: dict[int, float] = {}
"""The best repeat of each ``timed`` call, in call order (the least disturbed by other load)."""


def fresh_grants(data: dict[str, Any], n: int) -> list[Grant]:
    return [Grant.model_validate({**data, "call_id": f"call-{i:07d}",
                                  "expires_at": data["expires_at"] - i}) for i in range(n)]


# ---- scenarios -------------------------------------------------------------------------------

@dataclass
class Scenario:
    name: str
    builder_factory: Callable[[], ProfileBuilder]
    guard_factory: Callable[[], Guard]
    manifest: Manifest
    grant_data: dict[str, Any]
    op: Any
    cedar: Callable[[int], bool] | None


def _op(path: str) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(ExecOp).validate_python({"kind": "fs.read", "path": path})


def example_scenario() -> Scenario:
    ps = compile_files([str(EXAMPLES / "policies" / "org.sbpolicy")], home=HOME)
    manifest = Manifest.model_validate_json((EXAMPLES / "manifests" / "shell.json").read_text())
    grant = json.loads((EXAMPLES / "grants" / "shell-agent.json").read_text())
    cedar_policy = CEDAR_SECRETS + """
@id("org-secrets")
forbid (principal, action in [Action::"fs.read", Action::"fs.write"], resource is File)
when { resource.path like "/home/agent/.kube/*" || resource.path like "*.pem" ||
       resource.path like "*/id_rsa" || resource.path like "/workspace/.secrets/*" };
@id("read-workspace")
permit (principal, action == Action::"fs.read", resource is File)
when { resource.path like "/workspace/*" && principal.tool == "shell" };
"""
    return Scenario("example org policy, shell tool", lambda: ProfileBuilder(ps),
                    lambda: Guard(ps), manifest, grant, _op("/workspace/src/main.py"),
                    cedar_call(cedar_policy, grant, "/workspace/src/main.py"))


def scale_scenario(n_rules: int) -> Scenario:
    sp: ScalePolicy = scale_policy(n_rules)
    ps = compile_scale(sp)
    manifest = Manifest.model_validate(sp.manifest)
    return Scenario(f"{n_rules:,}-rule policy, 4-capability grant", lambda: ProfileBuilder(ps),
                    lambda: Guard(ps), manifest, sp.grant, _op(sp.read_path),
                    cedar_call(sp.cedar, sp.grant, sp.read_path))


def compile_scale(sp: ScalePolicy) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"scale-{sp.n_rules}.sbpolicy"
        path.write_text(sp.sbpolicy, encoding="utf-8")
        return compile_files([str(path)], home=HOME)


def cedar_call(policy_text: str, grant: dict[str, Any], path: str) -> Callable[[int], bool] | None:
    try:
        import cedarpy
    except ImportError:
        return None
    policies = cedarpy.PolicySet.from_str(policy_text)

    def call(i: int) -> bool:
        principal = {"type": "Agent", "id": grant["subject_id"]}
        entities = json.dumps([
            {"uid": principal, "parents": [],
             "attrs": {"tenant": grant["tenant"], "tool": grant["tool_name"],
                       "call_id": f"call-{i:07d}", "expires_at": grant["expires_at"] - i}},
            {"uid": {"type": "File", "id": path}, "attrs": {"path": path}, "parents": []},
        ])
        request = json.dumps({"principal": principal,
                              "action": {"type": "Action", "id": "fs.read"},
                              "resource": {"type": "File", "id": path}, "context": {}})
        result = cedarpy.is_authorized(json.loads(request), policies, entities)
        return bool(result.decision == cedarpy.Decision.Allow)

    assert call(0), "cedarpy must allow the benchmark read"
    return call


# ---- rows ------------------------------------------------------------------------------------

@dataclass(slots=True)
class Row:
    scenario: str
    what: str
    median_us: float
    ratio: str = ""
    best_us: float | None = None

    def __post_init__(self) -> None:
        if self.best_us is None and "(MB)" not in self.what and "(KB)" not in self.what:
            self.best_us = BEST.get(len(BEST) - 1)


def bench(sc: Scenario, cfg: Cfg) -> list[Row]:
    n = cfg.repeat * cfg.per_repeat
    grants = fresh_grants(sc.grant_data, 2 * n + 1)  # the GC-on row takes the second half
    builder, guard = sc.builder_factory(), sc.guard_factory()
    first = guard.decide(builder.build(grants[2 * n], sc.manifest), sc.op, now_ms=NOW_MS)
    if first.decision != "allow":
        raise SystemExit(f"{sc.name}: the benchmark read was refused: {first.reason}")

    def ours(i: int) -> object:
        d = guard.decide(builder.build(grants[i], sc.manifest), sc.op, now_ms=NOW_MS)
        assert d.decision == "allow"
        return d

    raw = [{**sc.grant_data, "call_id": f"raw-{i:07d}"} for i in range(n)]

    def ours_raw(i: int) -> object:
        grant = Grant.model_validate(raw[i])
        return guard.decide(builder.build(grant, sc.manifest), sc.op, now_ms=NOW_MS)

    subjects = [{**sc.grant_data, "subject_id": f"agent:s{i:07d}"} for i in range(n)]
    cold_grants = [Grant.model_validate(s) for s in subjects]

    def cold(i: int) -> object:
        # a grant shape never seen: the meet and the guard's compile run (the forbids are shared)
        return guard.decide(builder.build(cold_grants[i], sc.manifest), sc.op, now_ms=NOW_MS)

    # the guard bench_guard.py times against the peers: symlinks resolved, but no look at what
    # the fs executor will find on disk (a regular file, its size), which cedarpy never does
    policy_guard = Guard(builder.policyset, fs_facts=False)
    policy_guard.decide(builder.build(grants[2 * n], sc.manifest), sc.op, now_ms=NOW_MS)
    more = fresh_grants(sc.grant_data, n)

    def ours_policy(i: int) -> object:
        d = policy_guard.decide(builder.build(more[i], sc.manifest), sc.op, now_ms=NOW_MS)
        assert d.decision == "allow"
        return d

    rows = [Row(sc.name, "ours: fresh grant (new call_id) → build + decide", timed(ours, cfg)),
            Row(sc.name, "ours: same, GC on during the timing",
                timed(lambda i: ours(i + n), cfg, gc_on=True)),
            Row(sc.name, "ours: same, grant validated from a dict in the call",
                timed(ours_raw, cfg)),
            Row(sc.name, "ours: same, the decision without the disk facts (bench_guard's guard)",
                timed(ours_policy, cfg))]
    cold_cfg = Cfg(repeat=min(cfg.repeat, 5), per_repeat=max(10, cfg.per_repeat // 20))
    rows.append(Row(sc.name, "ours: new grant shape (new subject) → meet + compile + decide",
                    timed(cold, cold_cfg)))
    if sc.cedar is not None:
        cedar = timed(sc.cedar, cfg)
        rows.append(Row(sc.name, "cedarpy: request + entities parsed per call",
                        cedar, f"{cedar / rows[0].median_us:.1f}× ({cedar / rows[3].median_us:.1f}×"
                        " without the disk facts)"))
        cedar_gc = timed(sc.cedar, cfg, gc_on=True)
        rows.append(Row(sc.name, "cedarpy: same, GC on during the timing", cedar_gc,
                        f"{cedar_gc / rows[1].median_us:.1f}× (GC on)"))
    return rows


def memory_rows(n_rules: int, n_profiles: int) -> list[Row]:
    """RSS growth for ``n_profiles`` per-call profiles kept by builder and guard caches, in a
    fresh process (RSS never shrinks, so the timing rows must not run before it)."""
    out = subprocess.run([sys.executable, __file__, "--memory-only", str(n_rules),
                          str(n_profiles)], capture_output=True, text=True, check=True)
    total_mb, per_kb, base_mb = json.loads(out.stdout.strip().splitlines()[-1])
    name = f"{n_rules:,}-rule policy"
    return [Row(name, "RSS with the policy compiled, before any profile (MB)", base_mb),
            Row(name, f"RSS after {n_profiles:,} cached per-call profiles (MB)", total_mb),
            Row(name, "RSS per additional cached profile (KB)", per_kb)]


def _memory_only(n_rules: int, n_profiles: int) -> None:
    sp = scale_policy(n_rules)
    ps = compile_scale(sp)
    manifest = Manifest.model_validate(sp.manifest)
    op = _op(sp.read_path)
    builder = ProfileBuilder(ps, cache=ProfileCache(identity_size=n_profiles))
    guard = Guard(ps, cache_size=n_profiles)
    gc.collect()
    base = _rss_kib()
    first = fresh_grants(sp.grant, 1)[0]
    guard.decide(builder.build(first, manifest), op, now_ms=NOW_MS)
    gc.collect()
    before = _rss_kib()
    for i in range(1, n_profiles):
        # each call's grant is validated here and dropped by the caller: what stays alive is
        # what the caches keep (the builder's identity level holds the grant object too)
        g = Grant.model_validate({**sp.grant, "call_id": f"call-{i:07d}",
                                  "expires_at": sp.grant["expires_at"] - i})
        guard.decide(builder.build(g, manifest), op, now_ms=NOW_MS)
    gc.collect()
    after = _rss_kib()
    print(json.dumps([after / 1024, (after - before) / (n_profiles - 1), base / 1024]))


def _rss_kib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1])
    return float("nan")


# ---- report ----------------------------------------------------------------------------------

def render(rows: Sequence[Row], quick: bool) -> str:
    info = _machine_info()
    out = [SECTION, "",
           "Produced by `python benchmarks/bench_new_grant.py" + (" --quick" if quick else "")
           + "` (see its docstring). Every call uses a grant object no earlier call used; the "
           "median is over repeats of the per-call mean, with the collector off inside a "
           "repeat as `timeit` does (the 'GC on' rows keep it on). The machine is shared (2 CPUs, "
           "other test suites running), so single numbers move by 10–30 % between runs; the "
           "ratio is taken within one run.", "",
           f"Machine: {info['cpu']}, nproc {info['nproc']}, {info['python']}; {info['date']}; "
           f"load average at the end (1/5/15 min): {info['load']}.", "",
           "| scenario | row | median | best repeat | ratio to ours (medians) |",
           "|---|---|---:|---:|---:|"]
    for r in rows:
        unit = "" if "(MB)" in r.what or "(KB)" in r.what else " µs"
        best = "" if r.best_us is None else f"{r.best_us:.2f} µs"
        out.append(f"| {r.scenario} | {r.what} | {r.median_us:.2f}{unit} | {best} | {r.ratio} |")
    out.append("")
    return "\n".join(out)


def write_docs(section: str) -> None:
    replace_section(SECTION, section, DOCS)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short repeats; do not write the docs")
    ap.add_argument("--write", action="store_true", help="write the docs even with --quick")
    ap.add_argument("--memory", action="store_true",
                    help="also measure 10,000 cached profiles of the 1,000-rule policy (RSS)")
    ap.add_argument("--rules", type=int, default=1000, help="rules in the generated policy")
    ap.add_argument("--memory-only", nargs=2, type=int, metavar=("RULES", "PROFILES"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_only:
        _memory_only(*args.memory_only)
        return 0
    cfg = QUICK if args.quick else FULL
    rows = bench(example_scenario(), cfg) + bench(scale_scenario(args.rules), cfg)
    if args.memory:
        rows += memory_rows(args.rules, 10_000)
    section = render(rows, args.quick)
    print(section)
    if not args.quick or args.write:
        write_docs(section)
        print(f"updated {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
