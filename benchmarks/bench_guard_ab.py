"""Steady cached-decision cost of engine checkouts, interleaved A, B, A, B in one process.

Usage::

    python benchmarks/bench_guard_ab.py BEFORE_CHECKOUT [OTHER_CHECKOUT ...] [--repeats 600]

Each checkout's engine is imported in turn (its modules dropped from ``sys.modules`` before
the next is imported: the loaded functions keep their own globals), so both decide in one
process on one machine state. Per domain of the plain benchmark policy (untraced, no CEL,
``Guard.decide`` as ``bench_guard.py`` times it) the two engines' timeit repeats alternate,
A, B, A, B, each a few milliseconds long; the figure is the fastest repeat of each, the one
least disturbed by other processes on a shared machine; "Δ paired" is the median over the
repeats of each after repeat's time over the before repeat just preceding it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPEAT_S = 0.001
_OWN = ("policy_engine", "benchmarks", "plugins", "dsl")


def _drop_engine_modules() -> None:
    for name in list(sys.modules):
        if name.split(".", 1)[0] in _OWN:
            del sys.modules[name]


def load(checkout: str) -> dict[str, list[Callable[[], object]]]:
    """Per domain, the timed calls of ``checkout``'s engine (built while its tree is first)."""
    _drop_engine_modules()
    sys.path.insert(0, checkout)
    try:
        common = importlib.import_module("benchmarks.peers.common")
        peer = importlib.import_module("benchmarks.peers.policy_engine_peer")
        assert str(Path(peer.__file__ or "").resolve()).startswith(str(Path(checkout).resolve()))
        cases = common.load_cases("plain")
        engine = peer.Engine("plain", cases)
        return {d: [engine.timed_call(engine.prepare(c)) for c in cases if c.domain == d]
                for d in common.DOMAINS}
    finally:
        sys.path.remove(checkout)
        _drop_engine_modules()


def _timer(calls: Sequence[Callable[[], object]]) -> tuple[timeit.Timer, int]:
    def one_round() -> None:
        for f in calls:
            f()

    timer = timeit.Timer(one_round)
    number, took = timer.autorange()
    return timer, max(1, int(number * REPEAT_S / took))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after", nargs="*", help="checkouts to compare with BEFORE (default: this)")
    ap.add_argument("--repeats", type=int, default=600)
    args = ap.parse_args(argv)
    paths = [args.before, *(args.after or [str(ROOT)])]
    engines = [load(p) for p in paths]
    load_start = os.getloadavg()[0]
    head = "| domain | before µs |" + "".join(f" {Path(p).name} µs | Δ paired |" for p in paths[1:])
    print(head + "\n|---|" + "---:|" * (1 + 2 * (len(paths) - 1)))
    for domain in engines[0]:
        timers = [_timer(e[domain]) for e in engines]
        n = len(engines[0][domain])
        runs: list[list[float]] = [[] for _ in engines]
        for _ in range(args.repeats):
            for i, (timer, number) in enumerate(timers):
                runs[i].append(timer.timeit(number) / number / n * 1e6)
        row = f"| {domain} | {min(runs[0]):.2f} |"
        for other in runs[1:]:
            # each repeat over the before repeat of the same round, a few ms apart: a load
            # change between them is rare, so the median of these ratios is the steadier
            paired = statistics.median(y / x for x, y in zip(runs[0], other, strict=True))
            row += f" {min(other):.2f} | {(paired - 1) * 100:+.0f} % |"
        print(row)
    print(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
          f"fastest of {args.repeats} alternating repeats of ~{REPEAT_S * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
