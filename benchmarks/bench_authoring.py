"""Time `policy-engine lint`, `fmt --check` and `test` over the generated 1,000-file corpus.

Each command runs as a real subprocess of the `policy-engine` console script (with this
checkout first on PYTHONPATH, so the code measured is the code here), ``--repeat`` times; the
median wall time per command and their sum are compared with the issue's target of 10 s in
total. ``--write-docs`` puts the table under its own heading in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gen_policy_corpus  # noqa: E402  (a sibling script, not a package)
from docs_section import replace_section  # noqa: E402  (a sibling too)

TARGET_S = 10.0
HEADING = "## Authoring commands: lint, fmt --check, test (issue 5)"
DOCS = ROOT / "docs" / "benchmarks.md"


@dataclass
class Result:
    """The timings of one command and what it exited with."""

    name: str
    argv: list[str]
    times: list[float]
    codes: list[int]
    tail: str

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def _launcher() -> tuple[list[str], str]:
    """The console script if it is installed, else the same entry point through -m."""
    script = shutil.which("policy-engine")
    if script:
        return [script], "console script `policy-engine`"
    return [sys.executable, "-m", "policy_engine.cli"], "`python -m policy_engine.cli`"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _commands(corpus: Path) -> list[tuple[str, list[str]]]:
    return [
        ("lint", ["lint", str(corpus)]),
        ("fmt --check", ["fmt", "--check", str(corpus)]),
        ("test", ["test", str(corpus)]),
    ]


def run(corpus: Path, repeat: int) -> list[Result]:
    """Run every command ``repeat`` times; one untimed warm-up run fills the OS file cache."""
    launcher, _ = _launcher()
    results = []
    for name, args in _commands(corpus):
        argv = launcher + args
        subprocess.run(argv, capture_output=True, env=_env(), check=False)
        times, codes, tail = [], [], ""
        for _ in range(repeat):
            start = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), check=False)
            times.append(time.perf_counter() - start)
            codes.append(proc.returncode)
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        results.append(Result(name, args, times, codes, tail))
    return results


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{cpu}, nproc {os.cpu_count()}, CPython {platform.python_version()}, "
            f"{platform.platform()}; load average at the end (1/5/15 min): {load}")


def report(results: list[Result], corpus: Path, files: int, lines: int, repeat: int) -> str:
    """The markdown section: method, machine, the table and the verdict against the target."""
    total = sum(r.median for r in results)
    verdict = "MET" if total <= TARGET_S and all(c == 0 for r in results for c in r.codes) \
        else "MISSED"
    _, how = _launcher()
    rows = [
        f"| `policy-engine {' '.join(a if not a.startswith('/') else 'CORPUS' for a in r.argv)}` "
        f"| {r.median:.2f} | {min(r.times):.2f} | {max(r.times):.2f} "
        f"| {', '.join(str(c) for c in sorted(set(r.codes)))} |"
        for r in results
    ]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        HEADING,
        "",
        f"Produced by `python benchmarks/bench_authoring.py --write-docs` on {when}. The corpus "
        f"is `benchmarks/gen_policy_corpus.py` (seed 1): {files} team policies, {lines} lines, "
        f"each importing two of three shared files, plus {files} `.sbtest.yaml` files with "
        f"{files * 5} cases, in canonical `fmt` layout. Each command ran {repeat} times as a "
        f"subprocess of the {how} (one untimed warm-up run first); wall time in seconds, "
        "interpreter start-up included.",
        "",
        f"Machine: {_machine()}.",
        "",
        "| command | median s | min s | max s | exit codes |",
        "|---|---:|---:|---:|---|",
        *rows,
        f"| **total (sum of medians)** | **{total:.2f}** | | | |",
        "",
        f"Target: lint + fmt --check + test over 1,000 files ≤ {TARGET_S:.0f} s in total: "
        f"**{verdict}** ({total:.2f} s).",
        "",
    ])


def write_docs(section: str) -> None:
    replace_section(HEADING, section, DOCS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "build" / "policy-corpus")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reuse", action="store_true",
                        help="time an existing corpus instead of generating it again")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the results table into docs/benchmarks.md")
    args = parser.parse_args()
    if not (args.reuse and args.corpus.is_dir()):
        gen_policy_corpus.generate(args.corpus, args.files, args.seed)
        gen_policy_corpus.format_corpus(args.corpus)
    policies = sorted((args.corpus / "policies").glob("*.sbpolicy"))
    lines = sum(p.read_text(encoding="utf-8").count("\n") for p in policies)
    results = run(args.corpus, args.repeat)
    for r in results:
        if any(r.codes):
            print(f"warning: `{r.name}` exited {r.codes}: {r.tail}", file=sys.stderr)
    section = report(results, args.corpus, len(policies), lines, args.repeat)
    print(section)
    if args.write_docs:
        write_docs(section)


if __name__ == "__main__":
    main()
