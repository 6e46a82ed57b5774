"""Docker run-once vs warm pool (docker exec, launcher) vs bwrap: one short Python program.

Needs a running Docker Engine and the sandbox image (``source scripts/lib/dockerd.sh;
ensure_dockerd; bash scripts/build-images.sh``). Prints a markdown table of medians and ratios;
the target is a warm-pool median at most 1/5 of the run-once median.

    python benchmarks/bench_docker.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.executor import ExecContext, Executor
from policy_engine.model import (
    AllowLists,
    Budget,
    CapabilityKind,
    DenyLists,
    FsCapability,
    Limits,
    Mappings,
    NetworkMode,
    ProcExecOp,
    Profile,
    ProfileCapability,
    SafetyClass,
    SideEffect,
)

PROGRAM = "print(sum(range(1000)))"


def make_profile(root: Path) -> Profile:
    caps = tuple(ProfileCapability(kind=CapabilityKind(k), all_of=(FsCapability(
        kind=k, paths=(f"{root}/**",)),)) for k in ("fs.read", "fs.write"))
    return Profile(
        tenant="bench", subject_id="agent:bench", tool_name="py", call_id="bench",
        capabilities=caps, safety=SafetyClass.LOW, side_effects=(SideEffect.PROCESS,),
        limits=Limits(), budget=Budget(), allow=AllowLists(), deny=DenyLists(),
        mappings=Mappings(root_fs=str(root), tmp_dir=str(root / "tmp"), home=str(root / "home")),
        network=NetworkMode.OFF, timeout_ms=60_000, consent_required=False, expires_at=0,
        policy_name="bench", policy_version="1", policy_version_hash="h", manifest_version="1",
    )


def timed(ex: Executor, profile: Profile, tool: str, runs: int) -> list[float]:
    op = ProcExecOp(tool=tool, args=("-c", PROGRAM))
    samples: list[float] = []
    for i in range(runs + 2):  # two warm-ups (image cache, pool start)
        ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
        start = time.perf_counter()
        res = ex.execute(ctx, op)
        elapsed = time.perf_counter() - start
        assert res.out["stdout"].strip() == "499500", res.out
        if i >= 2:
            samples.append(elapsed)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-docker-"))
    (root / "tmp").mkdir()
    (root / "home").mkdir()
    profile = make_profile(root)
    backends: list[tuple[str, Callable[[], Executor], str]] = [
        ("docker run-once", lambda: DockerExecutor(DockerOptions(workspace_root=str(root))),
         "python3"),
        ("docker warm pool (docker exec)", lambda: DockerExecutor(DockerOptions(
            mode="pool", pool_size=1, workspace_root=str(root), pool_launcher=False)),
         "python3"),
        ("docker warm pool (launcher)", lambda: DockerExecutor(DockerOptions(
            mode="pool", pool_size=1, workspace_root=str(root))), "python3"),
        ("bwrap (plugins/executor_proc)", lambda: ProcExecutor("bwrap", ProcOptions()),
         "/usr/bin/python3"),
    ]
    medians: dict[str, float] = {}
    rows = []
    for name, make, tool in backends:
        ex = make()
        try:
            samples = timed(ex, profile, tool, args.runs)
        finally:
            ex.close()
        med = statistics.median(samples)
        medians[name] = med
        q = statistics.quantiles(samples, n=10)
        rows.append((name, med, q[0], q[-1]))
    base = medians["docker run-once"]
    print(f"\n{args.runs} runs each of `python3 -c \"{PROGRAM}\"` (after 2 warm-ups)\n")
    print("| backend | median ms | p10 ms | p90 ms | median / run-once |")
    print("|---|---:|---:|---:|---:|")
    for name, med, p10, p90 in rows:
        print(f"| {name} | {med * 1000:.1f} | {p10 * 1000:.1f} | {p90 * 1000:.1f} | "
              f"{med / base:.3f} |")
    for name in ("docker warm pool (docker exec)", "docker warm pool (launcher)"):
        ratio = medians[name] / base
        verdict = "met" if ratio <= 0.2 else "NOT met"
        print(f"\n{name} / run-once = {ratio:.3f} (target <= 0.200: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
