"""`POST /v1/decide` and `POST /v1/ops` (fs.read) under 50 concurrent keep-alive connections.

Starts `policy-engine serve` as a subprocess on a loopback port, then drives it from one
asyncio process with pre-encoded HTTP/1.1 requests (a light client: on 2 cores the load
generator competes with the server for CPU). Prints throughput and latency percentiles;
``--write`` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.docs_section import replace_section  # noqa: E402
from tests.integration.service_server import add_token, grant, start  # noqa: E402

SECTION = "## HTTP service (issue 13)"


def _request(path: str, token: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


async def _connection(host: str, port: int, raw: bytes, stop: float,
                      latencies: list[float], statuses: dict[int, int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            latencies.append((time.perf_counter() - t0) * 1000)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(url: str, raws: list[bytes], seconds: float,
                 pid: int) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    # warm-up: every connection opened and a few requests served before timing
    await asyncio.gather(*(_connection(host, int(port), raw, time.perf_counter() + 0.5, [], {})
                           for raw in raws))
    t0, cpu0 = time.perf_counter(), _cpu_s(pid)
    await asyncio.gather(*(_connection(host, int(port), raw, t0 + seconds, latencies, statuses)
                           for raw in raws))
    if set(statuses) != {200}:
        print("  statuses:", dict(sorted(statuses.items())))
    elapsed, cpu = time.perf_counter() - t0, _cpu_s(pid) - cpu0
    qs = statistics.quantiles(latencies, n=100)
    return {"requests": len(latencies), "rps": len(latencies) / elapsed,
            "p50": qs[49], "p99": qs[98], "ok": statuses.get(200, 0) / len(latencies),
            "cpu_ms": cpu * 1000 / len(latencies)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = str(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with start(root, "--rate-per-minute", "100000000") as svc:
            token = add_token(svc.state, "bench", "agent:bench")
            # one grant per connection (grants are per call): a grant's `concurrency` (default
            # 4) would otherwise refuse most of 50 simultaneous ops of one grant
            payloads = [json.dumps({
                "op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                "grant": grant("bench", "agent:bench", root, call_id=f"bench-{i}"),
                "manifest": "reader"}).encode() for i in range(args.connections)]
            rows = {}
            for name, path in (("decide", "/v1/decide"), ("ops fs.read", "/v1/ops")):
                raws = [_request(path, token, p) for p in payloads]
                rows[name] = asyncio.run(_drive(svc.url, raws, args.seconds, svc.proc.pid))
                print(name, {k: round(v, 2) for k, v in rows[name].items()})
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    text = [SECTION, "",
            "Produced by `python benchmarks/bench_service.py --write`: the real server "
            "(uvicorn, one process) in a subprocess, driven from one asyncio process over "
            f"{args.connections} keep-alive loopback connections for {args.seconds:g} s per "
            "endpoint after a 0.5 s warm-up; the client shares the machine's cores.", "",
            f"Machine: nproc {os.cpu_count()}, CPython {platform.python_version()}, "
            f"{platform.platform()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"load average at the end: {load}.", "",
            "Targets (decide): p99 ≤ 10 ms: "
            + ("MET" if rows["decide"]["p99"] <= 10 else "MISSED")
            + f" ({rows['decide']['p99']:.1f} ms); ≥ 1,500 decisions/s: "
            + ("MET" if rows["decide"]["rps"] >= 1500 else "MISSED")
            + f" ({rows['decide']['rps']:.0f}/s).", "",
            "Server CPU per request is the server process's user+system time over the requests "
            "served: it does not depend on what else the machine runs, and 1000 / it is what "
            "one core can serve. With 50 requests always in flight, mean latency is 50 / "
            "throughput (Little's law): a p99 of 10 ms would need more than 5,000 requests/s, "
            "so the two targets cannot both be met by one process at this concurrency.", "",
            "| endpoint | requests | per second | p50 ms | p99 ms | 200 OK "
            "| server CPU ms/request |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        text.append(f"| `{name}` | {r['requests']:.0f} | {r['rps']:.0f} | {r['p50']:.2f} | "
                    f"{r['p99']:.2f} | {r['ok']:.0%} | {r['cpu_ms']:.3f} |")
    section = "\n".join(text) + "\n"
    print(section)
    if args.write:
        replace_section(SECTION, section)

if __name__ == "__main__":
    main()
