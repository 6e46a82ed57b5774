"""`policy-engine mcp` over stdio under RLIMIT_AS 1 GiB answers every one of 3 batches of 20
concurrent tool calls (fuzz round 2, issue 32.11 M1: it aborted with "can't start new thread"
after the first batch, its address space full of per-thread malloc arenas and stacks)."""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 1 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _vm_size_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    raise AssertionError("no VmSize")


def test_twenty_concurrent_calls_under_one_gib(tmp_path: Path) -> None:
    for d in ("root/inputs", "root/work", "root/artifacts", "state"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "root/inputs/data.csv").write_text("a,b\n")
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(f'policy "m" version "1.0.0"\npermit "r" fs.read, fs.list paths '
                      f'["{tmp_path}/root/**"]\nrequire consent when `false`\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MALLOC_ARENA_MAX", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "policy_engine.cli", "mcp", "--policy", str(policy), "--skills",
         str(ROOT / "skills"), "--state-dir", str(tmp_path / "state"), "--root-fs",
         str(tmp_path / "root"), "--tenant", "acme", "--subject", "agent:x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_limit, env=env)
    assert proc.stdin is not None
    assert proc.stdout is not None
    answered: dict[int, dict[str, Any]] = {}
    buf = b""

    def send(msg: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()

    def wait_for(ids: set[int], timeout: float = 90.0) -> None:
        nonlocal buf
        end = time.monotonic() + timeout
        while not ids <= answered.keys() and time.monotonic() < end and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                data = os.read(proc.stdout.fileno(), 1 << 20)  # type: ignore[union-attr]
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    if "id" in msg:
                        answered[msg["id"]] = msg

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}})
    wait_for({0})
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    peak = 0
    n = 0
    try:
        for _batch in range(3):
            ids = set(range(n + 1, n + 21))
            for i in ids:
                send({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                    "name": "skill.files.read", "arguments": {"path": "inputs/data.csv"}}})
            n += 20
            wait_for(ids)
            assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
            assert ids <= answered.keys(), f"unanswered: {sorted(ids - answered.keys())}"
            peak = max(peak, _vm_size_kb(proc.pid))
        for i in range(1, n + 1):
            result = answered[i]["result"]
            assert result["isError"] is False, result
        # the bound holds with room: ~430 MB here, 1 GiB (and dead) before
        assert peak < 800 * 1024, peak
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert b"can't start new thread" not in proc.stderr.read()  # type: ignore[union-attr]
