"""net.http executor overhead over a bare, reused ``httpx.Client`` GET, same loopback server.

Usage::

    python benchmarks/bench_http.py              # 3000 interleaved iterations per case
    python benchmarks/bench_http.py --iterations 500

Both sides talk to one keep-alive HTTP/1.1 server on 127.0.0.1 started by this script and read
the same 1 KiB body. The executor side includes everything a call pays: the guard's decision,
URL parsing, name resolution (none for the IP literal; ``getaddrinfo`` via /etc/hosts for
``localhost``), address vetting, header cleaning, the pinned request, SHA-256 and head capture,
and the side-effect record. Iterations alternate between the two sides so drift hits both
equally; medians are reported. Target: at most 1 ms median overhead.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from plugins.executor_http import HttpExecutor  # noqa: E402 - needs the checkout root first
from policy_engine.executor import ExecContext  # noqa: E402
from policy_engine.model import NetHttpOp  # noqa: E402
from tests.integration.servers import LoopbackServer, http_profile, send  # noqa: E402

BODY = b"b" * 1024


def _time(fn: Callable[[], object]) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def bench(iterations: int) -> list[tuple[str, float, float]]:
    """Return (case, bare median µs, executor median µs) rows."""
    rows: list[tuple[str, float, float]] = []
    with LoopbackServer({"/b": lambda h: send(h, 200, "application/octet-stream", BODY)}) as srv:
        ex = HttpExecutor()
        client = httpx.Client(trust_env=False)
        try:
            for case, host in (("IP literal 127.0.0.1", "127.0.0.1"),
                               ("name `localhost` (resolved per call)", "localhost")):
                url = srv.url("/b", host=host)
                profile = http_profile(host, ports=(srv.port,))
                op = NetHttpOp(url=url)

                def bare(url: str = url) -> None:
                    r = client.get(url)
                    assert r.status_code == 200
                    assert len(r.content) == len(BODY)

                def executor(profile: object = profile, op: NetHttpOp = op) -> None:
                    ctx = ExecContext(profile=profile,  # type: ignore[arg-type]  # a Profile
                                      deadline=time.monotonic() + 30)
                    res = ex.execute(ctx, op)
                    assert res.out["status"] == 200

                for _ in range(200):  # warm-up: pools, caches, the guard's compiled profile
                    bare()
                    executor()
                a: list[int] = []
                b: list[int] = []
                for _ in range(iterations):
                    a.append(_time(bare))
                    b.append(_time(executor))
                rows.append((case, statistics.median(a) / 1000, statistics.median(b) / 1000))
        finally:
            client.close()
            ex.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3000)
    args = parser.parse_args()
    rows = bench(args.iterations)
    print(f"net.http executor vs bare httpx.Client — {args.iterations} interleaved iterations, "
          f"Python {platform.python_version()}, httpx {httpx.__version__}\n")
    print("| case | bare httpx (median µs) | executor (median µs) | overhead (µs) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for case, bare_us, ex_us in rows:
        print(f"| {case} | {bare_us:.0f} | {ex_us:.0f} | {ex_us - bare_us:.0f} "
              f"| {ex_us / bare_us:.2f}× |")


if __name__ == "__main__":
    main()
