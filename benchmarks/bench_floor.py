"""`/v1/decide` and `/v1/ops` against the framework floor: server CPU per request, same run.

Usage::

    python3 benchmarks/bench_floor.py --quick     # ~20 s; prints the table
    python3 benchmarks/bench_floor.py [--seconds 5] [--connections 4]
    BENCH_ENGINE_PATH=/other/checkout python3 benchmarks/bench_floor.py --quick  # "before"
    (the meter-cost table is always this checkout's meter)

Three servers run side by side on loopback: ``benchmarks/floor_app.py`` (a bare FastAPI app
parsing the same JSON body and answering a small object: the floor), and ``policy-engine serve``
(one worker, the embedded SQLite stores). Each row is a closed loop of ``--connections``
keep-alive connections from one asyncio client (``service_load.closed_asyncio``); server CPU is
the user+system time of the server process over the row (/proc), divided by its requests, so it
does not move with the client or other load the way latency does. One more row sends
``/v1/decide`` sequentially on one keep-alive connection (issue 27: p50 ≤ 1 ms; with Nagle on it
was ≈ 44 ms). Targets (issue 27): decide ≤ 1.5× the floor's CPU, ops fs.read ≤ 3×.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import service_load  # noqa: E402
from tests.integration.service_server import add_token, grant, start  # noqa: E402


def _body(root: Path, call_id: str) -> bytes:
    return json.dumps({"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                       "grant": grant("bench", "agent:bench", root, call_id=call_id),
                       "manifest": "reader"}).encode()


def _floor() -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "floor_app.py")],
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    assert match, line
    return proc, match.group(1)


def sequential(url: str, path: str, token: str, body: bytes, n: int) -> dict[str, float]:
    """``n`` requests one after the other on one keep-alive connection: p50/p99 in ms."""
    host, port = url.removeprefix("http://").split(":")
    raw = service_load._request(path, token, body)
    latencies = []
    with socket.create_connection((host, int(port))) as conn:
        reader = conn.makefile("rb")
        for i in range(n + 20):
            t0 = time.perf_counter()
            conn.sendall(raw)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += reader.readline()
            length = re.search(rb"content-length: (\d+)", head, re.I)
            assert length is not None, head
            assert head.startswith(b"HTTP/1.1 200"), head
            reader.read(int(length.group(1)))
            if i >= 20:  # warm-up
                latencies.append((time.perf_counter() - t0) * 1000)
    qs = statistics.quantiles(latencies, n=100)
    return {"p50": qs[49], "p99": qs[98]}


def meter_costs(n: int) -> dict[str, float]:
    """In-process, on the SQLite meter: what one `/v1/ops` call charges, median µs of each part
    and of the three together (the tenant's rate, the grant's `calls`, a concurrency slot
    taken and given back)."""
    from plugins.budget_sqlite import SqliteBudgetMeter
    from policy_engine.model import Limits
    from policy_engine.orchestration.budgeting import Slot
    from policy_engine.service.guards import charge_rate

    with tempfile.TemporaryDirectory() as tmp:
        meter = SqliteBudgetMeter(Path(tmp) / "budget.sqlite")
        limits = Limits(max_concurrency=4, timeout_ms=30_000)

        def rate() -> None:
            charge_rate(meter, "bench", 10**9)

        def calls() -> None:
            meter.check_and_consume("bench/agent/c-1", "calls", 1, None)

        def slot() -> None:
            held = Slot(meter, "bench/agent/c-1", limits, 30_000)
            held.take()
            held.release()

        parts = {"rate limit": rate, "`calls` charge": calls, "slot take + release": slot}
        samples: dict[str, list[float]] = {k: [] for k in [*parts, "together"]}
        for i in range(n + 50):
            t_all = 0.0
            for name, fn in parts.items():
                t0 = time.perf_counter()
                fn()
                took = (time.perf_counter() - t0) * 1e6
                t_all += took
                if i >= 50:
                    samples[name].append(took)
            if i >= 50:
                samples["together"].append(t_all)
        meter.close()
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="2 s per row")
    args = ap.parse_args()
    seconds = 2.0 if args.quick else args.seconds
    c = args.connections
    # the served engine: this checkout, or another one's for a "before" run; `python -m` puts
    # the working directory first on the server's path, so the server starts from there too
    engine = os.environ.get("BENCH_ENGINE_PATH") or str(REPO)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (engine, os.environ.get("PYTHONPATH")) if p)
    os.chdir(engine)
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        floor, floor_url = _floor()
        try:
            with start(root, "--rate-per-minute", "100000000") as svc:
                token = add_token(svc.state, "bench", "agent:bench")
                bodies = [_body(root, f"bench-{i}") for i in range(c)]
                seq = sequential(svc.url, "/v1/decide", token, bodies[0],
                                 200 if args.quick else 1000)
                plan = [("floor: bare FastAPI, same body", floor_url, "/floor", floor.pid),
                        ("/v1/decide (compact answer)", svc.url, "/v1/decide", svc.proc.pid),
                        ("/v1/decide?explain=full", svc.url, "/v1/decide?explain=full",
                         svc.proc.pid),
                        ("/v1/ops fs.read", svc.url, "/v1/ops", svc.proc.pid)]
                for label, url, path, pid in plan:
                    row = service_load.closed_asyncio(url, path, token, bodies, seconds, pid)
                    assert row["ok"] == 1.0, (label, row)
                    rows.append((label, row))
        finally:
            floor.terminate()
            floor.wait()
    base = rows[0][1]["cpu_ms"]
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load}; {os.cpu_count()} cores; closed loop, {c} connections, "
          f"{seconds:g} s per row")
    print("| row | requests/s | p50 ms | p99 ms | server CPU ms/request | × floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, r in rows:
        print(f"| {label} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
              f"{r['cpu_ms']:.3f} | {r['cpu_ms'] / base:.2f}× |")
    print(f"| /v1/decide sequential, one keep-alive connection | — | {seq['p50']:.2f} | "
          f"{seq['p99']:.2f} | — | — |")
    costs = meter_costs(500 if args.quick else 3000)
    print("\nWhat one `/v1/ops` call charges on the SQLite meter, in-process (median µs; "
          "issue 27: ≤ 200 µs together)")
    print("| part | µs |\n|---|---:|")
    for name, us in costs.items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
