"""Latency of MCP tool calls through `policy-engine mcp` with the SDK's client (stdio and HTTP).

    PYTHONPATH=. python3 benchmarks/bench_mcp.py [--calls N] [--exec-calls M]

Sequential calls on one session: `skill.files.read` (a decided fs.read with evidence) and
`skill.shell.run` (a docker container per call); prints the median and p95 in milliseconds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.mcp_fixtures import Setup, make_setup  # noqa: E402


def _summary(name: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    print(f"{name:<28} n={len(samples):<4} median {statistics.median(samples):7.1f} ms"
          f"   p95 {p95:7.1f} ms")


async def _drive(client: Client, label: str, calls: int, exec_calls: int) -> None:
    await client.call_tool("skill.files.read", {"path": "inputs/hello.txt"})  # warm up
    reads, execs = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        result = await client.call_tool("skill.files.read", {"path": "inputs/hello.txt"})
        reads.append((time.perf_counter() - t0) * 1000)
        assert not result.is_error, result
    for _ in range(exec_calls):
        t0 = time.perf_counter()
        result = await client.call_tool("skill.shell.run", {"script": "true"})
        execs.append((time.perf_counter() - t0) * 1000)
        assert not result.is_error, result
    _summary(f"{label} files.read", reads)
    if execs:
        _summary(f"{label} shell.run (docker)", execs)


async def _stdio(setup: Setup, calls: int, exec_calls: int) -> None:
    params = StdioServerParameters(command=sys.executable, env=setup.env(),
                                   args=setup.mcp_args("--tenant", "b", "--subject", "agent:b"))
    async with Client(params) as client:
        await _drive(client, "stdio", calls, exec_calls)


async def _http(setup: Setup, calls: int, exec_calls: int) -> None:
    token = setup.add_token("b", "agent:b")
    log = setup.root / "mcp.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, *setup.mcp_args("--transport", "http",
                                                                 "--port", "0")],
                                stderr=sink, stdout=subprocess.DEVNULL, env=setup.env())
    try:
        match = None
        while match is None:
            match = re.search(r"listening on (http://\S+/mcp)", log.read_text())
            await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(match.group(1),
                                                       http_client=http)) as client:
            await _drive(client, "http", calls, exec_calls)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--exec-calls", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup = make_setup(Path(tmp))
        anyio.run(_stdio, setup, args.calls, args.exec_calls)
        anyio.run(_http, setup, args.calls, args.exec_calls)


if __name__ == "__main__":
    main()
