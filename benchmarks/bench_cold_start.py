"""Cold start: wall time of short CLI runs, each a fresh interpreter, median of interleaved runs.

Usage::

    python benchmarks/bench_cold_start.py                       # ours; updates docs/benchmarks.md
    python benchmarks/bench_cold_start.py --baseline /work/main # and another checkout, same run
    python benchmarks/bench_cold_start.py --quick               # fewer runs; prints only

Each row starts ``sys.executable`` the way the ``policy-engine`` console script does (``from
policy_engine.cli.main import main; main()``) with ``PYTHONPATH`` set to the checkout measured,
so a pyenv/venv shim's own start-up is not counted, and without ``PYTHONDONTWRITEBYTECODE``
(the untimed first run writes the ``.pyc`` files an installed package has); ``python -c pass``
is the interpreter's floor (site-packages, ``.pth`` files) on the same machine. Runs of every
row and checkout are interleaved so a change of load hits them alike. The grammar cache is warm
(one untimed run first), as on any machine after the first command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `benchmarks` lives at the checkout root
    sys.path.insert(0, str(ROOT))
from benchmarks.docs_section import replace_section  # noqa: E402

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Cold start (issue: Speed and memory)"
ENTRY = "from policy_engine.cli.main import main; main()"
TARGETS_MS = {"explain": 200.0, "check": 250.0}

ROWS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "import policy_engine": ["-c", "import policy_engine"],
    "explain": ["-c", ENTRY, "explain", "--policy", "examples/policies/org.sbpolicy",
                "--request", "examples/requests/git-status.json"],
    "check": ["-c", ENTRY, "check", "examples/policies/org.sbpolicy"],
    "--help": ["-c", ENTRY, "--help"],
}


def run_once(argv: list[str], engine: Path) -> float:
    # PYTHONDONTWRITEBYTECODE (set in some CI and sandbox shells) would make every run compile
    # each of the ~100 modules from source (≈ 60 ms here): an installed package has its .pyc
    # files, so the warm-up run writes them and the timed runs read them
    env = {**os.environ, "PYTHONPATH": str(engine)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    # cwd is the checkout too: `-c` puts the cwd first on sys.path
    done = subprocess.run([sys.executable, *argv], cwd=engine, env=env, capture_output=True,
                          check=False)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed under {engine}: {done.stderr.decode()[-400:]}")
    return elapsed


def measure(engines: dict[str, Path], runs: int) -> dict[tuple[str, str], float]:
    for engine in engines.values():  # warm: page cache, grammar cache, .pyc files
        for argv in ROWS.values():
            run_once(argv, engine)
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(runs):
        for row, argv in ROWS.items():
            for name, engine in engines.items():
                samples.setdefault((row, name), []).append(run_once(argv, engine))
    return {k: statistics.median(v) for k, v in samples.items()}


def render(result: dict[tuple[str, str], float], engines: Sequence[str], runs: int,
           quick: bool) -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    head = "| run | " + " | ".join(f"{e} ms" for e in engines) + " |"
    out = [SECTION, "",
           "Produced by `python benchmarks/bench_cold_start.py" + (" --quick" if quick else "")
           + (" --baseline …" if len(engines) > 1 else "") + f"` (see its docstring): median "
           f"wall time of {runs} interleaved runs per row, each a fresh interpreter. The machine "
           "is shared (2 CPUs, several other test suites running): absolute numbers move with "
           "the load, the columns of one run compare.", "",
           f"Load average at the end (1/5/15 min): {load}; {sys.version.split()[0]}.", "",
           head, "|---|" + "---:|" * len(engines)]
    for row in ROWS:
        out.append(f"| `{row}` | " + " | ".join(f"{result[(row, e)]:.0f}" for e in engines)
                   + " |")
    out.append("")
    ours = engines[0]
    floor = result[("python -c pass", ours)]
    for row, target in TARGETS_MS.items():
        got = result[(row, ours)]
        out.append(f"- `{row}` ≤ {target:.0f} ms: {'MET' if got <= target else 'MISSED'} "
                   f"({got:.0f} ms; {got - floor:.0f} ms above the bare interpreter)")
    out.append("")
    return "\n".join(out)


def write_docs(section: str) -> None:
    replace_section(SECTION, section, DOCS)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 runs per row; do not write docs")
    ap.add_argument("--baseline", type=Path, help="another checkout, measured in the same run")
    ap.add_argument("--runs", type=int, default=None)
    args = ap.parse_args(argv)
    runs = args.runs or (5 if args.quick else 21)
    engines = {"ours": ROOT}
    if args.baseline is not None:
        engines["baseline"] = args.baseline.resolve()
    result = measure(engines, runs)
    section = render(result, list(engines), runs, args.quick)
    print(section)
    if not args.quick:
        write_docs(section)
        print(f"updated {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
