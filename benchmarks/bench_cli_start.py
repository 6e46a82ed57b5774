"""CLI start with the plugins loaded: CPU of short `policy-engine` runs, the plugins' import cost.

Usage::

    python benchmarks/bench_cli_start.py --quick                        # 5 runs; prints only
    python benchmarks/bench_cli_start.py --baseline /work/main          # and another checkout
    python benchmarks/bench_cli_start.py                                # 11 runs; updates docs

Rows: ``run`` of a ``tmp.alloc`` op (examples/requests/tmp-alloc-small.json: loads every plugin,
builds every executor, writes evidence, in a fresh state directory each time, as a test does),
``check`` of the example policy (no plugin), and ``plugins`` (the listing). Each is a fresh
interpreter started like the console script (``PYTHONPATH`` = the checkout), its CPU (user +
system, from the child's rusage) and wall time taken; runs of every row and checkout are
interleaved so a change of load hits them alike, and the table gives medians. The last rows are
``python -X importtime`` of ``PluginManager.default()``: the summed top-level cumulative import
time, and which plugin SDKs (playwright, docker, redis, psycopg, httpx, httpcore, trio) the
start imported.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `benchmarks` lives at the checkout root
    sys.path.insert(0, str(ROOT))
from benchmarks.docs_section import replace_section  # noqa: E402

SECTION = "## CLI start with plugins (issue 30 item 7)"
ENTRY = "from policy_engine.cli.main import main; main()"
POLICY = "examples/policies/org.sbpolicy"
ROWS: dict[str, list[str]] = {
    "run tmp.alloc": ["run", "--policy", POLICY, "--request",
                      "examples/requests/tmp-alloc-small.json"],
    "check": ["check", POLICY],
    "plugins": ["plugins"],
}
SDKS = ("playwright", "docker", "redis", "psycopg", "httpx", "httpcore", "trio")
NOTES = (
    "The plugins' SDKs (Playwright, the docker SDK with requests, redis, psycopg, httpx with "
    "httpcore and trio) are imported by the first call that needs them "
    "(`policy_engine.lazy.lazy_module`), and the browser executor's refusing proxy, the http "
    "executor's connection pools and CA store are made then too: a start that serves none of "
    "those ops pays for none. `check` loads no plugin, hence no change. What a `run` still "
    "spends before its op (a cProfile of one run): the compiler and the gateway's imports "
    "(≈ 0.45 s under this load) and the proc-bwrap executor's construction, whose bubblewrap "
    "probe starts a subprocess (≈ 0.15 s; plugins/executor_proc, not changed here).")
_IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)")


def _env(engine: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(engine)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc files
    return env


def run_once(row: str, engine: Path, scratch: Path) -> tuple[float, float]:
    """``(cpu_ms, wall_ms)`` of one CLI run of ``row`` under ``engine``."""
    argv = list(ROWS[row])
    if row.startswith("run"):
        argv += ["--state-dir", tempfile.mkdtemp(dir=scratch)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", ENTRY, *argv], cwd=engine, env=_env(engine),
                          capture_output=True, check=False)
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1) or (row != "plugins" and done.returncode != 0):
        raise SystemExit(f"{row} failed under {engine}: {done.stderr.decode()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return cpu, wall


def import_cost(engine: Path) -> tuple[float, list[str]]:
    """Summed top-level cumulative import time (ms) of ``PluginManager.default()`` and the
    plugin SDKs it imported."""
    code = "from policy_engine.plugin_manager import PluginManager; PluginManager.default()"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=engine,
                          env=_env(engine), capture_output=True, text=True, check=True)
    total, seen = 0, set()
    for line in done.stderr.splitlines():
        found = _IMPORT_LINE.match(line)
        if found is None:
            continue
        seen.add(found.group(3).split(".")[0])
        if not found.group(2):  # top level: its cumulative time holds its children's
            total += int(found.group(1))
    return total / 1000, [m for m in SDKS if m in seen]


def measure(engines: dict[str, Path], runs: int) -> dict[tuple[str, str], tuple[float, float]]:
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cli-start-") as tmp:
        scratch = Path(tmp)
        for engine in engines.values():  # warm: page cache, grammar cache, .pyc files
            for row in ROWS:
                run_once(row, engine, scratch)
        for _ in range(runs):
            for row in ROWS:
                for name, engine in engines.items():
                    samples.setdefault((row, name), []).append(run_once(row, engine, scratch))
    return {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
            for k, v in samples.items()}


def render(result: dict[tuple[str, str], tuple[float, float]],
           imports: dict[str, tuple[float, list[str]]], runs: int, quick: bool) -> str:
    engines = list(imports)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    out = [SECTION, "",
           "Produced by `python benchmarks/bench_cli_start.py" + (" --quick" if quick else "")
           + (" --baseline …" if len(engines) > 1 else "") + f"` (see its docstring): medians "
           f"of {runs} interleaved runs per row, each a fresh interpreter. The machine is shared "
           "(2 CPUs, other suites running): absolute numbers move with the load, the columns of "
           "one run compare.", "",
           f"Load average at the end (1/5/15 min): {load}; {sys.version.split()[0]}.", "",
           "| run | " + " | ".join(f"{e} CPU ms | {e} wall ms" for e in engines) + " |",
           "|---|" + "---:|---:|" * len(engines)]
    for row in ROWS:
        out.append(f"| `{row}` | " + " | ".join(
            f"{result[(row, e)][0]:.0f} | {result[(row, e)][1]:.0f}" for e in engines) + " |")
    out.append("| imports of `PluginManager.default()`, ms | " + " | ".join(
        f"{imports[e][0]:.0f} | " for e in engines) + " |")
    out.append("| plugin SDKs it imported | " + " | ".join(
        f"{', '.join(imports[e][1]) or 'none'} | " for e in engines) + " |")
    out += ["", NOTES, ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 runs per row; do not write docs")
    ap.add_argument("--baseline", type=Path, help="another checkout, measured in the same run")
    ap.add_argument("--runs", type=int, default=None)
    args = ap.parse_args(argv)
    runs = args.runs or (5 if args.quick else 11)
    engines = {"ours": ROOT}
    if args.baseline is not None:
        engines["baseline"] = args.baseline.resolve()
    result = measure(engines, runs)
    imports = {name: import_cost(engine) for name, engine in engines.items()}
    section = render(result, imports, runs, args.quick)
    print(section)
    if not args.quick:
        replace_section(SECTION, section)
        print("updated docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
