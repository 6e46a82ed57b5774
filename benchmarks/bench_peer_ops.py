"""The peer scenario: requests of 3 ops each, every op built from its JSON form per call, ours
beside cedarpy, one run (issue 27 item 5).

Usage::

    python3 benchmarks/bench_peer_ops.py --quick   # ~15 s; prints the table
    python3 benchmarks/bench_peer_ops.py           # more repeats

The decision set is bench_guard's (``fixtures/decisions.yaml``, plain variant, 63 ops over six
domains), taken three at a time as one request. Per request, ours builds each op from its dict
(``Guard.decide`` on the mapping: one pydantic validation, the op's lone-surrogate screen) and
decides it under the grant's cached profile, as a service handling an agent's batch does;
cedarpy builds each request from the op per call (the shared normalization, the resource uid
and the request dict) and calls ``cedarpy.is_authorized`` with its policy set and entities
parsed once. A third row decides ops validated once outside the timing (ours, no
construction). Every answer is checked against the decision set before timing. Rows report the
median over repeats of the mean per request; the ratio is cedarpy's over ours, same run.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.peers import cedar_peer, policy_engine_peer  # noqa: E402
from benchmarks.peers.common import load_cases, prepare  # noqa: E402

PER_REQUEST = 3


def _ours(engine: policy_engine_peer.Engine, batches: list[list[Any]],
          now_ms: int) -> Callable[[], list[bool]]:
    profile = engine.profile("agent:bench")
    decide = engine.guard.decide

    def run() -> list[bool]:
        out = []
        for batch in batches:
            for op in batch:  # a mapping: the guard builds the op model per call
                out.append(decide(profile, op, now_ms=now_ms).allowed)
        return out
    return run


def _cedar(engine: cedar_peer.Engine, batches: list[list[Any]]) -> Callable[[], list[bool]]:
    import cedarpy

    policies, entities = engine.policies, engine.entities
    allow = cedarpy.Decision.Allow

    def run() -> list[bool]:
        out = []
        for batch in batches:
            for op in batch:  # the request built from the op per call
                uid, _ = cedar_peer._resource(prepare(op))
                request = {"principal": {"type": "Agent", "id": "bench"},
                           "action": {"type": "Action", "id": op["kind"]}, "resource": uid}
                out.append(cedarpy.is_authorized(request, policies, entities).decision == allow)
        return out
    return run


def _timed(fn: Callable[[], object], repeats: int, requests: int) -> float:
    """Median over ``repeats`` of the mean µs per request (collector paused while timing)."""
    samples = []
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6 / requests)
        finally:
            gc.enable()
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="7 repeats of 20 passes")
    args = ap.parse_args()
    repeats, passes = (7, 20) if args.quick else (21, 50)
    cases = load_cases("plain")
    ops = [dict(c.op) for c in cases]
    want = [c.want for c in cases]
    now_ms = cases[0].ctx.now_ms
    ours_engine = policy_engine_peer.Engine("plain", cases, resolve_symlinks=False)
    cedar_engine = cedar_peer.Engine("plain", cases)
    batches = [ops[i:i + PER_REQUEST] for i in range(0, len(ops), PER_REQUEST)]
    built = [[policy_engine_peer._OPS.validate_python(op) for op in b] for b in batches]
    rows: dict[str, Callable[[], list[bool]]] = {
        "policy-engine, ops built per call": _ours(ours_engine, batches, now_ms),
        "policy-engine, ops validated once (no construction)": _ours(ours_engine, built, now_ms),
        "cedarpy, requests built per call": _cedar(cedar_engine, batches),
    }
    for name, fn in rows.items():  # the equivalence gate
        got = fn()
        assert got == want, (name, [c.label for c, g, w in zip(cases, got, want, strict=True)
                                    if g != w])
    requests = len(batches) * passes
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(3):  # interleaved alternations: load shifts hit every row alike
        for name, fn in rows.items():
            times[name].append(_timed(lambda f=fn: [f() for _ in range(passes)],  # type: ignore[misc]
                                      repeats, requests))
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    ours = statistics.median(times["policy-engine, ops built per call"])
    print(f"{len(batches)} requests of {PER_REQUEST} ops ({len(ops)} ops, fixtures/decisions.yaml "
          f"plain), {passes} passes × {repeats} repeats × 3 alternations; load average {load}")
    print("| row | µs per request | ratio to ours (built per call) |\n|---|---:|---:|")
    for name, samples in times.items():
        us = statistics.median(samples)
        print(f"| {name} | {us:.2f} | {us / ours:.2f}× |")
    cedar = statistics.median(times["cedarpy, requests built per call"])
    verdict = "MET" if cedar / ours >= 3 else "MISSED"
    print(f"\nTarget (issue 27): ours ≥ 3× cedarpy in this scenario: {verdict} "
          f"({cedar / ours:.2f}×)")


if __name__ == "__main__":
    main()
