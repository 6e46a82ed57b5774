"""`POST /v1/decide` and `POST /v1/ops` (fs.read) throughput of one and of two `policy-engine
serve` replicas sharing one Redis (meter, revocations) and one PostgreSQL (evidence, tokens),
against one replica on the embedded SQLite/JSONL stores. Needs the loopback servers of
scripts/lib/redis.sh and postgres.sh (``POLICY_ENGINE_TEST_REDIS_URL``, ``..._PG_DSN``; without
them, those scripts' defaults: Redis on 127.0.0.1:16379, PostgreSQL on 127.0.0.1:15432).

Usage: python3 benchmarks/bench_replicas.py [--quick] [--seconds 5] [--connections 20] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from benchmarks.docs_section import replace_section  # noqa: E402
from benchmarks.service_load import _request  # noqa: E402
from tests.integration.service_server import grant, manifest  # noqa: E402
from tests.integration.shared_servers import entry_points_dir  # noqa: E402
from tests.integration.test_replicas import POLICY, Replica, _token  # noqa: E402

SECTION = "## Replicas: one and two, shared Redis and PostgreSQL (issue 18)"
REDIS_DEFAULT = "redis://127.0.0.1:16379/0"  # scripts/lib/redis.sh
PG_DEFAULT = "postgresql://postgres@127.0.0.1:15432/postgres"  # scripts/lib/postgres.sh


async def _connection(host: str, port: int, raw: bytes, stop: float, latencies: list[float],
                      statuses: dict[int, int]) -> None:
    """One keep-alive connection sending ``raw`` until ``stop``; each answer's latency (ms)
    and status are recorded."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", head, re.I)
            assert length is not None, head
            await reader.readexactly(int(length.group(1)))
            latencies.append((time.perf_counter() - t0) * 1000)
            status = int(head[9:12])
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def _drive(urls: list[str], raws: list[bytes], conns: int,
                 seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    targets = [u.removeprefix("http://").split(":") for u in urls]
    await asyncio.gather(*(_connection(targets[i % len(targets)][0],
                                       int(targets[i % len(targets)][1]), raws[i],
                                       time.perf_counter() + 0.5, [], {})
                           for i in range(conns)))
    t0 = time.perf_counter()
    await asyncio.gather(*(_connection(targets[i % len(targets)][0],
                                       int(targets[i % len(targets)][1]), raws[i],
                                       t0 + seconds, latencies, statuses)
                           for i in range(conns)))
    elapsed = time.perf_counter() - t0
    qs = statistics.quantiles(latencies, n=100)
    return {"rps": len(latencies) / elapsed, "p50": qs[49], "p99": qs[98],
            "ok": statuses.get(200, 0) / len(latencies)}


def _setup(root: Path, redis_url: str, dsn: str | None, names: list[str]) -> dict[str, Path]:
    (root / "data").mkdir(exist_ok=True)
    (root / "data" / "hello.txt").write_text("hello\n")
    (root / "reader.json").write_text(json.dumps(manifest(root)))
    (root / "shared.sbpolicy").write_text(POLICY.format(root=root))
    configs = {}
    for name in names:
        config = root / f"{name}.yaml"
        shared = {"budget_meter": "redis", "revocation": "redis", "evidence_sinks": ["postgres"],
                  "options": {"budget_redis": {"url": redis_url, "prefix": f"b-{root.name}:"},
                              "evidence_postgres": {"dsn": dsn, "replica": name},
                              "service_postgres": {"dsn": dsn}}}
        config.write_text(json.dumps(shared if dsn else {}))
        configs[name] = config
    return configs


def run(label: str, names: list[str], redis_url: str, dsn: str | None, args: argparse.Namespace,
        env: dict[str, str]) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        configs = _setup(root, redis_url, dsn, names)
        replicas = [Replica(root, n, configs[n], root / "shared.sbpolicy", env,
                            "--rate-per-minute", "100000000") for n in names]
        try:
            if dsn:
                token, _ = _token(root, env)
            else:  # the embedded token store of the one replica
                token, _ = _token_sqlite(root / names[0], env)
            # one grant per connection: one grant's calls in flight are capped (concurrency 4)
            payloads = [json.dumps({
                "op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                "grant": grant("acme", "agent:x", root, call_id=f"c-{i}"),
                "manifest": "reader"}).encode() for i in range(args.connections)]
            for what, path in (("decide", "/v1/decide"), ("ops fs.read", "/v1/ops")):
                raws = [_request(path, token, p) for p in payloads]
                r = asyncio.run(_drive([x.url for x in replicas], raws, args.connections,
                                       args.seconds))
                print(label, what, {k: round(v, 2) for k, v in r.items()})
                rows.append(f"| {label} | `{what}` | {r['rps']:.0f} | {r['p50']:.1f} | "
                            f"{r['p99']:.1f} | {r['ok']:.0%} |")
        finally:
            for x in replicas:
                x.stop()
    return rows


def _token_sqlite(state: Path, env: dict[str, str]) -> tuple[str, str]:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "add",
                           "--tenant", "acme", "--subject", "agent:x", "--state-dir",
                           str(state), "--format", "json"], capture_output=True, text=True,
                          env=env, check=True)
    data = json.loads(done.stdout)
    return str(data["token"]), str(data["token_id"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=20)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--quick", action="store_true", help="1 s per row, 4 connections; writes "
                    "nothing")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.connections, args.write = 1.0, 4, False
    redis_url = os.environ.get("POLICY_ENGINE_TEST_REDIS_URL", REDIS_DEFAULT)
    server = os.environ.get("POLICY_ENGINE_TEST_PG_DSN", PG_DEFAULT)
    db = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    dsn = f"{server.rsplit('/', 1)[0]}/{db}"
    with tempfile.TemporaryDirectory() as ep:
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join([str(entry_points_dir(Path(ep))), str(REPO)])
        try:
            rows = (run("1 replica, embedded SQLite/JSONL", ["a"], redis_url, None, args, env)
                    + run("1 replica, Redis + PostgreSQL", ["a"], redis_url, dsn, args, env)
                    + run("2 replicas, Redis + PostgreSQL", ["a", "b"], redis_url, dsn, args,
                          env))
        finally:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    text = "\n".join([
        SECTION, "",
        f"`python3 benchmarks/bench_replicas.py --seconds {args.seconds:g} --connections "
        f"{args.connections}`: real `serve` processes, {args.connections} keep-alive loopback "
        "connections spread over the replicas, one asyncio client on the same machine "
        f"({os.cpu_count()} cores, shared with other work: load average {load} at the end; "
        "the replicas, Redis, PostgreSQL and the client all compete for the same cores). "
        "One `serve` process is one Python interpreter, so a second replica adds throughput "
        "even here; with the shared stores every request also looks its token up in "
        "PostgreSQL and charges the tenant's rate limit in Redis (two round trips a decision "
        "does not pay on the embedded stores).", "",
        "| setup | endpoint | requests/s | p50 ms | p99 ms | 200 OK |",
        "|---|---|---:|---:|---:|---:|", *rows]) + "\n"
    print(text)
    if args.write:
        replace_section(SECTION, text)


if __name__ == "__main__":
    main()
