"""Load generators for bench_service.py: wrk (closed loop), and asyncio closed and open loops.

Each returns the same row: requests, requests/s, p50/p99 latency (ms), the share of 200
answers and the server's CPU ms per request (user+system of the server process and its
workers, /proc): CPU per request does not depend on what else the machine runs, latency does.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

Row = dict[str, float]

# wrk runs one LuaJIT state per thread; `request` builds each request, here with a fresh
# call_id when asked (every call its own grant, as agents send them)
_LUA = r"""
local body, token, fresh = %s, %s, %s
local pre, post = body:match('^(.-"call_id": ")[^"]*(".*)$')
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}
local n, tag = 0, tostring(os.time())
request = function()
  n = n + 1
  local b = fresh and (pre .. "w" .. tag .. "-" .. n .. post) or body
  return wrk.format("POST", nil, headers, b)
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %%d %%.3f %%.3f %%d\n", summary.requests,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, summary.errors.status))
end
"""


def _lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


def server_pids(pid: int) -> list[int]:
    """``pid`` and its child processes (the workers)."""
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                pids.append(int(entry))
    return pids


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk(url: str, token: str, body: bytes, *, fresh: bool, seconds: float, connections: int,
        pid: int) -> Row:
    """Closed loop: ``connections`` keep-alive connections, each sending its next request when
    the answer to the last one arrived (wrk, one thread: a C client that leaves the cores to the
    server)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_LUA % (_lua_string(body.decode()), _lua_string(token),
                             "true" if fresh else "false"))
    try:
        warm = ["wrk", "-t1", f"-c{connections}", "-d1s", "-s", script.name, url]
        subprocess.run(warm, capture_output=True, check=True, timeout=60)
        pids = server_pids(pid)
        cpu0, client0 = cpu_s(pids), _children_cpu_s()
        done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s",
                               script.name, url], capture_output=True, text=True, check=True,
                              timeout=seconds + 60)
        cpu, client = cpu_s(pids) - cpu0, _children_cpu_s() - client0
    finally:
        os.unlink(script.name)
    match = re.search(r"RESULT (\d+) ([\d.]+) ([\d.]+) (\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    n, p50, p99, bad = (float(x) for x in match.groups())
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1))  # type: ignore[union-attr]
    return {"requests": n, "rps": rps, "p50": p50, "p99": p99, "ok": (n - bad) / n,
            "cpu_ms": cpu * 1000 / n, "client_cores": client / seconds}


def _request(path: str, token: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    raw: bytes) -> int:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    await reader.readexactly(length)
    return int(head[9:12])


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _row(latencies: list[float], statuses: list[int], elapsed: float, cpu: float,
         client: float) -> Row:
    qs = statistics.quantiles(latencies, n=100)
    return {"requests": len(latencies), "rps": len(latencies) / elapsed, "p50": qs[49],
            "p99": qs[98], "ok": statuses.count(200) / len(statuses),
            "cpu_ms": cpu * 1000 / len(latencies), "client_cores": client / elapsed}


async def _closed(url: str, path: str, token: str, bodies: list[bytes], seconds: float,
                  pid: int) -> Row:
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    statuses: list[int] = []

    async def connection(raw: bytes, stop: float, record: bool) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                status = await _exchange(reader, writer, raw)
                if record:
                    latencies.append((time.perf_counter() - t0) * 1000)
                    statuses.append(status)
        finally:
            writer.close()

    raws = [_request(path, token, b) for b in bodies]
    await asyncio.gather(*(connection(r, time.perf_counter() + 0.5, False) for r in raws))
    pids = server_pids(pid)
    t0, cpu0, own0 = time.perf_counter(), cpu_s(pids), time.process_time()
    await asyncio.gather(*(connection(r, t0 + seconds, True) for r in raws))
    return _row(latencies, statuses, time.perf_counter() - t0, cpu_s(pids) - cpu0,
                time.process_time() - own0)


def closed_asyncio(url: str, path: str, token: str, bodies: list[bytes], seconds: float,
                   pid: int) -> Row:
    """Closed loop from one asyncio process (pre-encoded requests, one body per connection):
    the client shares the machine's cores with the server."""
    return asyncio.run(_closed(url, path, token, bodies, seconds, pid))


async def _open(url: str, path: str, token: str, body: bytes, rate: float, seconds: float,
                connections: int, pid: int) -> Row:
    host, port = url.removeprefix("http://").split(":")
    raw = _request(path, token, body)
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await asyncio.open_connection(host, int(port)))
    latencies: list[float] = []
    statuses: list[int] = []

    async def one(scheduled: float) -> None:
        conn = await pool.get()  # waiting for a free connection counts: it is latency too
        try:
            statuses.append(await _exchange(*conn, raw))
        finally:
            pool.put_nowait(conn)
        latencies.append((time.perf_counter() - scheduled) * 1000)

    pids = server_pids(pid)
    t0, cpu0, own0 = time.perf_counter(), cpu_s(pids), time.process_time()
    tasks = []
    total = int(rate * seconds)
    for i in range(total):
        scheduled = t0 + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    row = _row(latencies, statuses, time.perf_counter() - t0, cpu_s(pids) - cpu0,
               time.process_time() - own0)
    while not pool.empty():
        pool.get_nowait()[1].close()
    return row


def open_asyncio(url: str, path: str, token: str, body: bytes, rate: float, seconds: float,
                 connections: int, pid: int) -> Row:
    """Open loop: request i is due at ``i / rate`` s whatever the answers do, sent on the next
    free one of ``connections``; latency runs from the due time (no coordinated omission: a
    stalled server shows as latency, not as fewer requests)."""
    return asyncio.run(_open(url, path, token, body, rate, seconds, connections, pid))
