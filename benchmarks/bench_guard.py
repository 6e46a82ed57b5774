"""Guard decision latency per domain, ours beside cedarpy, pycasbin and regopy, in one run.

Usage::

    python benchmarks/bench_guard.py           # full run (minutes); updates docs/benchmarks.md
    python benchmarks/bench_guard.py --quick   # < 60 s sanity run; prints the table only
    BENCH_ENGINE_PATH=/other/checkout python benchmarks/bench_guard.py --quick  # "before"

Every engine first decides the whole decision set (benchmarks/fixtures/decisions.yaml); if any
answer differs from the wanted one the run stops before timing anything. See
benchmarks/README.md for what each row includes and excludes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: `benchmarks` lives at the root
    sys.path.insert(0, str(ROOT))
ENGINE_ENV = "BENCH_ENGINE_PATH"
"""Another checkout whose engine to measure (a "before" run): its path goes first."""
if os.environ.get(ENGINE_ENV):
    sys.path.insert(0, os.environ[ENGINE_ENV])

from benchmarks.docs_section import replace_section  # noqa: E402
from benchmarks.peers import (  # noqa: E402 - needs the checkout root on sys.path first
    casbin_peer,
    cedar_peer,
    common,
    policy_engine_peer,
    rego_peer,
)

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Cached decisions (issue: Speed and memory)"
TARGET_DECIDE_US = 4.0
TARGET_CEDAR_RATIO = 6.0
TARGET_CEDAR_RATIO_CEL = 4.0
GRANT_SIZES = (1, 1001)
TARGET_CACHED_BUILD_US = 2.0


@dataclass(frozen=True, slots=True)
class Settings:
    repeat: int
    min_repeat_s: float
    samples: int
    sample_budget_s: float


FULL = Settings(repeat=7, min_repeat_s=0.2, samples=5000, sample_budget_s=0.5)
QUICK = Settings(repeat=3, min_repeat_s=0.02, samples=600, sample_budget_s=0.05)


@dataclass(frozen=True, slots=True)
class Row:
    engine: str
    domain: str
    condition: str
    median_us: float
    p90_us: float
    n_cases: int
    ratio: float | None = None


# ---- timing ----------------------------------------------------------------------------------

def _timer_overhead_ns() -> float:
    pc = time.perf_counter_ns
    samples = []
    for _ in range(2000):
        t0 = pc()
        t1 = pc()
        samples.append(t1 - t0)
    return statistics.median(samples)


_OVERHEAD_NS = 0.0


def _calibrate(timer: timeit.Timer, min_s: float) -> int:
    """Loops per repeat so one repeat lasts at least ``min_s`` (like ``Timer.autorange``)."""
    number = 1
    while True:
        t = timer.timeit(number)
        if t >= min_s:
            return number
        number = max(number * 2, int(number * min_s / max(t, 1e-9) * 1.1))


def _p90_single(calls: Sequence[Callable[[], object]], per_round: int, cfg: Settings) -> float:
    """p90 (µs per decision) of individually timed calls, timer overhead subtracted, GC off."""
    pc = time.perf_counter_ns
    singles: list[float] = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        deadline = time.perf_counter() + cfg.sample_budget_s
        n = len(calls)
        i = 0
        while i < cfg.samples and (i < n or time.perf_counter() < deadline):
            f = calls[i % n]
            t0 = pc()
            f()
            t1 = pc()
            singles.append((t1 - t0 - _OVERHEAD_NS) / 1000 * n / per_round)
            i += 1
    finally:
        if gc_was:
            gc.enable()
    return statistics.quantiles(singles, n=10)[-1] if len(singles) >= 10 else max(singles)


def measure(groups: Sequence[tuple[Sequence[Callable[[], object]], int]],
            cfg: Settings) -> list[tuple[float, float]]:
    """Median per-decision time (µs) over ``cfg.repeat`` timeit repeats, and p90 of single calls,
    for each group; the groups' repeats are interleaved so a load change hits every engine alike.

    :param groups: per engine, zero-argument callables cycled round-robin, and how many decisions
        one pass over them makes (more than the number of callables for a batch call).
    """
    timers = []
    for calls, _ in groups:
        def one_round(calls: Sequence[Callable[[], object]] = calls) -> None:
            for f in calls:
                f()

        timer = timeit.Timer(one_round)
        timers.append((timer, _calibrate(timer, cfg.min_repeat_s)))
    runs: list[list[float]] = [[] for _ in groups]
    gc_was = gc.isenabled()
    gc.disable()  # as timeit does
    try:
        for _ in range(cfg.repeat):
            for i, (timer, number) in enumerate(timers):
                runs[i].append(timer.timeit(number) / number)
    finally:
        if gc_was:
            gc.enable()
    return [(statistics.median(r) / per_round * 1e6, _p90_single(calls, per_round, cfg))
            for r, (calls, per_round) in zip(runs, groups, strict=True)]


# ---- engines ---------------------------------------------------------------------------------

def peer_modules() -> tuple[list[ModuleType], dict[str, str]]:
    """The peers to run and, for any that cannot, why."""
    mods: list[ModuleType] = [cedar_peer, casbin_peer]
    missing: dict[str, str] = {}
    err = rego_peer.import_error()
    if err is None:
        mods.append(rego_peer)
    else:
        missing[rego_peer.NAME] = err
    return mods, missing


def check_equivalence(engines: Sequence[Any], cases: Sequence[common.Case],
                      variant: str) -> list[str]:
    """Every engine's answer on every case; the disagreements (with the wanted answer)."""
    problems = []
    for case in cases:
        answers = {e.name: e.decide(e.prepare(case)) for e in engines}
        if any(a is not case.want for a in answers.values()):
            got = ", ".join(f"{k}={'allow' if v else 'deny'}" for k, v in answers.items())
            problems.append(f"[{variant}] {case.label}: want "
                            f"{'allow' if case.want else 'deny'}; {got}")
    return problems


def bench_variant(variant: str, cfg: Settings, domains: Sequence[str]) -> list[Row]:
    cases = common.load_cases(variant, tuple(domains))
    ours = policy_engine_peer.Engine(variant, cases)
    ours_lexical = policy_engine_peer.Engine(variant, cases, resolve_symlinks=False)
    mods, _ = peer_modules()
    peers = [m.Engine(variant, cases) for m in mods]
    problems = check_equivalence([ours, *peers], cases, variant)
    problems += check_equivalence([ours_lexical], [c for c in cases
                                                   if c.domain.startswith("fs.")], variant)
    if problems:
        print("ENGINES DISAGREE — no timing reported:", *problems, sep="\n  ", file=sys.stderr)
        raise SystemExit(1)
    condition = "none" if variant == "plain" else "CEL `when`"
    rows: list[Row] = []
    for domain in domains:
        dcases = [c for c in cases if c.domain == domain]
        n = len(dcases)
        labels: list[str] = [ours.name]
        groups: list[tuple[Sequence[Callable[[], object]], int]] = [
            ([ours.timed_call(ours.prepare(c)) for c in dcases], n)]
        if domain.startswith("fs."):
            labels.append(f"{ours.name} (no symlink walk)")
            groups.append(([ours_lexical.timed_call(ours_lexical.prepare(c)) for c in dcases], n))
        for peer in peers:
            prepared = [peer.prepare(c) for c in dcases]
            labels.append(peer.name)
            groups.append(([peer.timed_call(p) for p in prepared], n))
            if isinstance(peer, cedar_peer.Engine):
                labels.append(f"{peer.name} (batch of {n})")
                groups.append(([peer.batch_call(prepared)], n))
        results = measure(groups, cfg)
        ours_med = results[0][0]
        for label, (med, p90) in zip(labels, results, strict=True):
            rows.append(Row(label, domain, condition, med, p90, n, med / ours_med))
    return rows


def bench_profile_build(cfg: Settings) -> list[Row]:
    """ProfileBuilder.build: cold (empty cache), a cached shape (equal inputs in new objects:
    a copy of the template with its own call fields and hash), and cached by identity (the
    same grant and manifest objects)."""
    from policy_engine.profile import ProfileBuilder
    from policy_engine.profile.cache import ProfileCache

    ps = policy_engine_peer.compile_policy("plain")
    grant = policy_engine_peer.grant_for("agent:bench")
    manifest = policy_engine_peer.manifest()
    cold = ProfileBuilder(ps)

    def build_cold() -> object:
        cold.cache.clear()
        return cold.build(grant, manifest)

    by_shape = ProfileBuilder(ps, cache=ProfileCache(identity_size=0))
    by_shape.build(grant, manifest)
    copies = [(grant.model_copy(), manifest.model_copy()) for _ in range(64)]
    shape_calls = [lambda g=g, m=m: by_shape.build(g, m) for g, m in copies]
    warm = ProfileBuilder(ps)
    warm.build(grant, manifest)
    rows = []
    for label, calls in (("cold", [build_cold]), ("cached shape (equal inputs)", shape_calls),
                         ("cached (same objects)", [lambda: warm.build(grant, manifest)])):
        ((med, p90),) = measure([(calls, len(calls))], cfg)
        rows.append(Row("policy-engine", "profile build", label, med, p90, 1))
    return rows


GRANT_SIZE_POLICY = """\
policy "bench/grant-size" version "1.0.0"
defaults {
  timeout 60s
  network on
}
permit "read-workspace" fs.read paths ["/workspace/**", "~/**"]
  when `grant.subject_id.startsWith("agent:") && now.getHours() >= 8 && now.getHours() < 20`
"""


def bench_grant_size(cfg: Settings) -> list[Row]:
    """One allowed ``fs.read`` whose permit's condition reads ``grant``, under grants of 1 and
    1,001 capabilities (the guard without the symlink walk: this row is about CEL)."""
    import tempfile

    from policy_engine.compiler import compile_files
    from policy_engine.guard import Guard
    from policy_engine.model import Consent, FsCapability, Grant
    from policy_engine.profile import ProfileBuilder

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "grant_size.sbpolicy"
        path.write_text(GRANT_SIZE_POLICY, encoding="utf-8")
        ps = compile_files([str(path)], home=common.home())
    builder = ProfileBuilder(ps)
    guard = Guard(ps, resolve_symlinks=False, fs_facts=False)
    case = common.load_cases("cel", ("fs.read",))[0]
    _, op, now_ms = policy_engine_peer.Engine("plain", []).prepare(case)
    rows = []
    for n in GRANT_SIZES:
        caps = (FsCapability(kind="fs.read", paths=("/**",)),) + tuple(
            FsCapability(kind="fs.read", paths=(f"/extra{i}/**",)) for i in range(n - 1))
        grant = Grant(tenant="acme", subject_id="agent:bench", tool_name="bench-tool",
                      call_id="call-1", capabilities=caps,
                      expires_at=policy_engine_peer.FAR_FUTURE_MS,
                      consent=Consent(granted_by="human:ops", granted_at=0,
                                      expires_at=policy_engine_peer.FAR_FUTURE_MS))
        profile = builder.build(grant, policy_engine_peer.manifest())
        if not guard.decide(profile, op, now_ms=now_ms).allowed:
            raise SystemExit(f"grant-size case: {case.label} was not allowed")
        call = partial(guard.decide, profile, op, now_ms=now_ms)
        ((med, p90),) = measure([([call], 1)], cfg)
        rows.append(Row("policy-engine", "fs.read", f"CEL reads `grant`, {n:,}-capability grant",
                        med, p90, 1))
    return rows


# ---- report ----------------------------------------------------------------------------------

def machine_info() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "load": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpu": cpu,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "versions": ", ".join(f"{m.NAME} {m.version()}" for m in (
            policy_engine_peer, cedar_peer, casbin_peer, rego_peer)
            if m is not rego_peer or rego_peer.import_error() is None),
    }


def table(rows: Sequence[Row]) -> str:
    out = ["| engine | domain | condition | median µs | p90 µs | ratio to ours |",
           "|---|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = "—" if r.ratio is None else ("1.0× (ours)" if r.engine == "policy-engine"
                                              else f"{r.ratio:.1f}×")
        out.append(f"| {r.engine} | {r.domain} | {r.condition} | {r.median_us:.2f} | "
                   f"{r.p90_us:.2f} | {ratio} |")
    return "\n".join(out)


def verdicts(rows: Sequence[Row]) -> list[str]:
    """The issue's targets for cached decisions, each MET or MISSED with the numbers."""
    out = []
    for condition, target in (("none", TARGET_CEDAR_RATIO), ("CEL `when`", TARGET_CEDAR_RATIO_CEL)):
        ours = [r for r in rows if r.engine == "policy-engine" and r.condition == condition]
        cedar = {r.domain: r for r in rows if r.engine == "cedarpy" and r.condition == condition}
        if not ours:
            continue
        if condition == "none":
            worst = max(ours, key=lambda r: r.median_us)
            out.append(f"- ours, median per decision without CEL ≤ {TARGET_DECIDE_US:g} µs in "
                       f"every domain: {'MET' if worst.median_us <= TARGET_DECIDE_US else 'MISSED'}"
                       f" (slowest domain {worst.domain}: {worst.median_us:.2f} µs)")
        ratios = [(cedar[r.domain].median_us / r.median_us, r.domain)
                  for r in ours if r.domain in cedar]
        if ratios:
            low = min(ratios)
            what = "without CEL" if condition == "none" else "with CEL"
            out.append(f"- ≥ {target:g}× faster than cedarpy {what} in every domain (single "
                       f"calls, same run): {'MET' if low[0] >= target else 'MISSED'} (lowest: "
                       f"{low[0]:.1f}× on {low[1]})")
    sized = [r for r in rows if "capability grant" in r.condition]
    if len(sized) == 2:
        small, big = sized
        extra = big.median_us - small.median_us
        out.append(f"- CEL cost independent of the grant's size: "
                   f"{'MET' if big.median_us <= small.median_us * 1.15 else 'MISSED'} "
                   f"({small.median_us:.2f} µs with 1 capability, {big.median_us:.2f} µs with "
                   f"1,001: {extra:+.2f} µs)")
    builds = {r.condition: r for r in rows if r.domain == "profile build"}
    cached = builds.get("cached (same objects)")
    if cached is not None:
        out.append(f"- cached profile build ≤ {TARGET_CACHED_BUILD_US:g} µs (issue: Core engine): "
                   f"{'MET' if cached.median_us <= TARGET_CACHED_BUILD_US else 'MISSED'} "
                   f"({cached.median_us:.2f} µs same objects; "
                   f"{builds['cached shape (equal inputs)'].median_us:.2f} µs equal inputs)")
    return out


def render_section(rows: Sequence[Row], info: dict[str, str], missing: dict[str, str],
                   quick: bool) -> str:
    lines = [
        SECTION, "",
        "Produced by `python benchmarks/bench_guard.py"
        + (" --quick`" if quick else "`") + " (method: benchmarks/README.md). "
        "Every engine gave the wanted answer on the whole decision set before anything was "
        "timed. Median: median over timeit repeats of the per-decision mean; p90: 90th "
        "percentile of individually timed calls (timer overhead subtracted). Ratio: the row's "
        "median over ours for the same domain and condition (> 1 = slower than ours).", "",
        f"Machine: {info['cpu']}, nproc {info['nproc']}, {info['python']}, {info['platform']}; "
        f"{info['date']}; load average at the end (1/5/15 min): {info['load']}. "
        f"Versions: {info['versions']}.", "",
        "Targets:", *verdicts(rows), "",
    ]
    for name, why in missing.items():
        lines += [f"- {name}: not run — {why}", ""]
    lines += [table(rows), ""]
    return "\n".join(lines)


def write_docs(section: str) -> None:
    replace_section(SECTION, section, DOCS)


def main(argv: Sequence[str] | None = None) -> int:
    global _OVERHEAD_NS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short repeats; do not write the docs")
    ap.add_argument("--write", action="store_true",
                    help="write docs/benchmarks.md even with --quick")
    ap.add_argument("--domain", action="append", choices=common.DOMAINS,
                    help="only these domains (repeatable)")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    domains = tuple(args.domain or common.DOMAINS)
    _OVERHEAD_NS = _timer_overhead_ns()
    started = time.perf_counter()
    rows: list[Row] = []
    for variant in common.VARIANTS:
        rows += bench_variant(variant, cfg, domains)
    rows += bench_grant_size(cfg)
    rows += bench_profile_build(cfg)
    _, missing = peer_modules()
    info = machine_info()
    section = render_section(rows, info, missing, args.quick)
    print(section)
    print(f"(ran in {time.perf_counter() - started:.0f} s)")
    if os.environ.get(ENGINE_ENV):
        print(f"({ENGINE_ENV} is set: a baseline run; docs not written)")
    elif not args.quick or args.write:
        write_docs(section)
        print(f"updated {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
