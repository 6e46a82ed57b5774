"""Python bytecodes and calls one cached decision runs, per domain, for engine checkouts (a count).

Usage::

    python benchmarks/bench_guard_ops.py CHECKOUT [CHECKOUT ...]

Where ``bench_guard_ab.py`` times the checkouts (and a loaded machine moves its ratios by a few
points from run to run), this counts, with ``sys.settrace`` opcode events, what each decision
of the plain benchmark policy executes in Python (untraced, no CEL, as ``bench_guard.py``
calls it): the mean over a domain's cases of the bytecodes and of the Python-level calls. The
count is the same on every run; C work (the path probe, regexes, dict lookups) is not in it,
so it says where a time difference comes from, not how large it is.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_guard_ab import _drop_engine_modules  # noqa: E402


def load(checkout: str) -> list[tuple[str, Callable[[], object]]]:
    """``(domain, timed call)`` per case of ``checkout``'s engine (as ``bench_guard_ab.load``)."""
    _drop_engine_modules()
    sys.path.insert(0, checkout)
    try:
        common = importlib.import_module("benchmarks.peers.common")
        peer = importlib.import_module("benchmarks.peers.policy_engine_peer")
        assert str(Path(peer.__file__ or "").resolve()).startswith(str(Path(checkout).resolve()))
        cases = common.load_cases("plain")
        engine = peer.Engine("plain", cases)
        return [(c.domain, engine.timed_call(engine.prepare(c))) for c in cases]
    finally:
        sys.path.remove(checkout)
        _drop_engine_modules()


def count(call: Callable[[], object]) -> tuple[int, int]:
    """The bytecodes and Python calls of one ``call()`` (after a first, warming one)."""
    ops = calls = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal ops, calls
        if event == "call":
            calls += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            ops += 1
        return tracer

    call()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return ops, calls


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("checkouts", nargs="+")
    args = ap.parse_args(argv)
    engines = [load(p) for p in args.checkouts]
    print("| domain |" + "".join(f" {Path(p).resolve().name} |" for p in args.checkouts))
    print("|---|" + "---:|" * len(engines))
    for domain in dict.fromkeys(d for d, _ in engines[0]):
        row = f"| {domain} |"
        for engine in engines:
            counts = [count(f) for d, f in engine if d == domain]
            n = len(counts)
            row += (f" {sum(o for o, _ in counts) / n:.0f} ops,"
                    f" {sum(c for _, c in counts) / n:.1f} calls |")
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
