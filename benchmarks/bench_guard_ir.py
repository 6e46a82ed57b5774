"""Machine instructions one cached decision executes, per domain, for engine checkouts (a count
that the machine's load does not move).

Usage::

    python benchmarks/bench_guard_ir.py CHECKOUT [CHECKOUT ...] [--rounds 20] [--symlinks]

On a shared machine whose load never drops, timings of two checkouts move by several points
from run to run (``bench_guard_ab.py`` interleaves them to pair the noise); an instruction count
does not. Each checkout's engine runs under ``valgrind --tool=callgrind`` (user-space
instructions, ``Ir``): the plain benchmark policy's cases (``bench_guard.py``'s, untraced, no
CEL), each domain ``--rounds`` times after two warming calls per case, counted only inside the
timed calls (``operator.methodcaller`` is the collection trigger, ``math.gcd`` between domains
the dump trigger); the figure is the count per decision. The guard runs without the symlink
walk unless ``--symlinks``: valgrind does not know ``openat2``, so under it the one-syscall
probe fails and every fs decision walks its path with ``lstat`` (not what runs natively).
Kernel work (the probe's syscall) is never counted; cache misses and branch mispredictions
are not in the count either, so it says which checkout executes less, not by how many µs.
"""

from __future__ import annotations

import argparse
import math
import operator
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOMAINS = ("fs.read", "fs.write", "net.http", "proc.exec", "browser.nav", "tmp.alloc")


def child(checkout: str, rounds: int, symlinks: bool) -> None:
    """Runs under valgrind: every domain's timed calls, ``rounds`` times."""
    sys.path.insert(0, checkout)
    from benchmarks.peers import common, policy_engine_peer

    cases = common.load_cases("plain")
    engine = policy_engine_peer.Engine("plain", cases, resolve_symlinks=symlinks)
    calls = {d: [engine.timed_call(engine.prepare(c)) for c in cases if c.domain == d]
             for d in DOMAINS}
    for domain_calls in calls.values():
        for f in domain_calls:
            f()
            f()
    call = operator.methodcaller("__call__")
    for domain_calls in calls.values():
        math.gcd(1, 1)  # dump: what ran since the last one
        for _ in range(rounds):
            for f in domain_calls:
                call(f)
    math.gcd(1, 1)
    sys.stdout.write(" ".join(str(len(calls[d])) for d in DOMAINS) + "\n")


def count(checkout: str, rounds: int, symlinks: bool) -> dict[str, float]:
    """Instructions per decision per domain of ``checkout``'s engine."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=methodcaller_call", "--dump-before=math_gcd",
               f"--callgrind-out-file={out}", sys.executable, __file__, "--child", checkout,
               "--rounds", str(rounds)] + (["--symlinks"] if symlinks else [])
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        sizes = [int(n) for n in done.stdout.split()]
        parts = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = []
        for part in parts:
            m = re.search(r"^(?:summary|totals): (\d+)", part.read_text(), re.MULTILINE)
            totals.append(int(m.group(1)) if m else 0)
    # part 1 holds the warming calls (dumped at the first gcd); parts 2..7 the domains
    return {d: totals[i + 1] / (rounds * n) for i, (d, n) in enumerate(zip(DOMAINS, sizes,
                                                                           strict=True))}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("checkouts", nargs="+")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--symlinks", action="store_true",
                    help="the guard's symlink walk on (under valgrind: lstat per component)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.checkouts[0], args.rounds, args.symlinks)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return 2
    counts = [count(str(Path(c).resolve()), args.rounds, args.symlinks) for c in args.checkouts]
    names = [Path(c).resolve().name for c in args.checkouts]
    print("| domain | " + " | ".join(f"{n} Ir" for n in names) +
          "".join(f" | {n} / {names[0]}" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for d in DOMAINS:
        base = counts[0][d]
        print(f"| {d} | " + " | ".join(f"{c[d]:,.0f}" for c in counts) +
              "".join(f" | {c[d] / base - 1:+.1%}" for c in counts[1:]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
