"""`policy-engine serve` under RLIMIT_AS 1 GiB keeps answering while 40 execs arrive at once
(fuzz round 2, issue 32.11 F15: the worker pool grew a thread, a 64 MiB malloc arena and an
8 MiB stack per request until the address space was full, and then answered nothing, not even
`/sandbox/health`). The bound: a worker pool of serving.SERVE_CONCURRENT_CALLS + 2 threads and
shared malloc arenas."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.service_server import POLICY, add_token

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 1 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _vm_size_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))


def test_forty_concurrent_execs_under_one_gib(tmp_path: Path) -> None:
    state, ws = tmp_path / "state", tmp_path / "state" / "workspace"
    (tmp_path / "data").mkdir()
    policy = tmp_path / "svc.sbpolicy"
    policy.write_text(POLICY.format(root=tmp_path, ws=ws))
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MALLOC_ARENA_MAX", None)
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "policy_engine.cli", "serve", "--policy", str(policy),
             "--state-dir", str(state), "--root-fs", str(tmp_path), "--port", "0"],
            stderr=sink, stdout=subprocess.DEVNULL, env=env, preexec_fn=_limit)
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        url = m.group(1)
        token = add_token(state, "acme", "agent:alice")
        headers = {"Authorization": f"Bearer {token}"}
        body = {"project_id": "bounds", "exec": {"kind": "python",
                                                 "script": "import time; time.sleep(1)"}}

        def one(_: int) -> int:
            try:
                return httpx.post(f"{url}/sandbox/execs", json=body, headers=headers,
                                  timeout=180).status_code
            except httpx.TransportError:
                return 0

        peak = 0
        with ThreadPoolExecutor(40) as pool:
            futures = [pool.submit(one, i) for i in range(40)]
            while not all(f.done() for f in futures):
                peak = max(peak, _vm_size_kb(proc.pid))
                time.sleep(0.2)
            codes = [f.result() for f in futures]
        assert codes == [200] * 40, (codes, log.read_text()[-3000:])
        health = httpx.get(f"{url}/sandbox/health", timeout=30)
        assert health.status_code == 200
        assert peak < 900 * 1024, peak
    finally:
        proc.terminate()
        proc.wait(30)
    assert "MemoryError" not in log.read_text()
    assert "can't start new thread" not in log.read_text()
