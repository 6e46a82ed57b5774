"""Budget meter latency, SQLite vs Redis, and one engine's op throughput with the embedded
stores (SQLite meter, JSONL evidence) vs the shared ones (Redis meter + revocations,
PostgreSQL evidence). Needs the loopback servers of scripts/lib/redis.sh and postgres.sh
(``POLICY_ENGINE_TEST_REDIS_URL``, ``POLICY_ENGINE_TEST_PG_DSN``).

Usage: python3 benchmarks/bench_meters.py [--n 3000] [--write]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from benchmarks.docs_section import replace_section  # noqa: E402
from plugins.budget_redis import RedisBudgetMeter, RedisStore  # noqa: E402
from plugins.budget_sqlite import SqliteBudgetMeter  # noqa: E402
from policy_engine.compiler import compile_files  # noqa: E402
from policy_engine.config import EngineConfig  # noqa: E402
from policy_engine.orchestrator import Orchestrator  # noqa: E402
from tests.integration.shared_servers import plugin_manager  # noqa: E402
from tests.integration.store_fixtures import make_fixture  # noqa: E402

SECTION = "## Shared state: Redis and PostgreSQL (issue 18)"


def _timed(fn: Callable[[int], object], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _row(name: str, us: list[float]) -> str:
    us = sorted(us)
    p50, p99 = us[len(us) // 2], us[int(len(us) * 0.99)]
    return (f"| {name} | {len(us)} | {p50:.0f} | {p99:.0f} | "
            f"{1e6 / statistics.fmean(us):,.0f} |")


def meters(n: int, url: str, tmp: Path) -> list[str]:
    sqlite = SqliteBudgetMeter(tmp / "budget.sqlite")
    red = RedisBudgetMeter(RedisStore(url, prefix=f"bench-{uuid.uuid4().hex[:8]}:"))
    rows = []
    for name, meter in (("sqlite `check_and_consume`", sqlite),
                        ("redis `check_and_consume`", red)):
        meter.check_and_consume("warm", "calls", 1, None)
        rows.append(_row(name, _timed(
            lambda i, m=meter: m.check_and_consume(f"g{i % 50}", "calls", 1, 10**9), n)))
    for name, slots in (("sqlite slot acquire+release", sqlite),
                        ("redis slot acquire+release", red)):
        rows.append(_row(name, _timed(
            lambda i, s=slots: s.release("g", s.acquire("g", 4, hold_s=60)), n // 3)))
    sqlite.close()
    red.close()
    return rows


def orchestrators(n: int, url: str, dsn: str, tmp: Path) -> list[str]:
    fx = make_fixture(tmp / "fx")
    db = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    shared = {"budget_meter": "redis", "revocation": "redis", "evidence_sinks": ("postgres",),
              "options": {"budget_redis": {"url": url, "prefix": f"bench-{db}:"},
                          "evidence_postgres": {"dsn": f"{dsn.rsplit('/', 1)[0]}/{db}"}}}
    rows = []
    try:
        for name, extra in (("embedded: sqlite meter + revocations, jsonl evidence", {}),
                            ("shared: redis meter + revocations, postgres evidence", shared)):
            config = EngineConfig(state_dir=tmp / name[:6], **extra)  # type: ignore[arg-type]
            with Orchestrator(compile_files([fx.policy]), config=config,
                              plugins=plugin_manager()) as orch:
                fx.run(orch)
                rows.append(_row(f"`Orchestrator.run` fs.read, {name}",
                                 _timed(lambda _i, o=orch: fx.run(o), n // 3)))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    url = os.environ["POLICY_ENGINE_TEST_REDIS_URL"]
    dsn = os.environ["POLICY_ENGINE_TEST_PG_DSN"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = meters(args.n, url, Path(tmp)) + orchestrators(args.n, url, dsn, Path(tmp))
    table = "\n".join(["| what | n | p50 µs | p99 µs | ops/s (one thread) |",
                       "|---|---:|---:|---:|---:|", *rows])
    text = (f"{SECTION}\n\n`python3 benchmarks/bench_meters.py --n {args.n}` on "
            f"{platform.machine()}, {os.cpu_count()} cores (shared with other work), Redis "
            "and PostgreSQL on loopback (no persistence, fsync off: the network round trip "
            "and the server's work, not the disk):\n\n" + table + "\n")
    print(text)
    if args.write:
        replace_section(SECTION, text)


if __name__ == "__main__":
    main()
