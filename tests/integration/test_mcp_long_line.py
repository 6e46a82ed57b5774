"""`policy-engine mcp` over stdio refuses a JSON-RPC line over the message bound (16 MiB) with a
JSON-RPC error, without holding the line, and goes on serving (attack round 32, M3: a 64 MiB
line grew the server ~1 MiB per MiB and, under a 1 GiB address-space limit, killed it)."""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 1 << 30
MIB = 1 << 20


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _hwm_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def _policy_and_root(tmp_path: Path) -> Path:
    """A root with ``inputs/a.txt``, a state dir, and a policy reading the root; the policy."""
    for d in ("root/inputs", "state"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "root/inputs/a.txt").write_text("a\n")
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(f'policy "m" version "1.0.0"\npermit "r" fs.read paths '
                      f'["{tmp_path}/root/**"]\n')
    return policy


def test_a_64_mib_line_is_refused_and_the_server_goes_on(tmp_path: Path) -> None:
    policy = _policy_and_root(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "policy_engine.cli", "mcp", "--policy", str(policy), "--skills",
         str(ROOT / "skills"), "--state-dir", str(tmp_path / "state"), "--root-fs",
         str(tmp_path / "root"), "--tenant", "acme", "--subject", "agent:x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_limit, env=env)
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    answered: dict[Any, dict[str, Any]] = {}
    stderr: list[bytes] = []
    threading.Thread(target=lambda: stderr.append(proc.stderr.read()),  # type: ignore[union-attr]
                     daemon=True).start()

    def drain() -> None:  # stdout is read all along: a blocked writer must not stall the test
        buf = b""
        while True:
            data = os.read(proc.stdout.fileno(), MIB)  # type: ignore[union-attr]
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                msg = json.loads(line)
                answered[msg.get("id")] = msg

    threading.Thread(target=drain, daemon=True).start()

    def send(raw: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(raw)
        proc.stdin.flush()

    def wait_for(key: Any, timeout: float = 60.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while key not in answered and time.monotonic() < end and proc.poll() is None:
            select.select([], [], [], 0.1)
        assert key in answered, (key, proc.poll(), b"".join(stderr)[-2000:])
        return answered[key]

    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}}).encode() + b"\n")
        wait_for(0)
        send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        send(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
        wait_for(1)
        before = _hwm_mib(proc.pid)
        # a valid request 64 MiB long: only its length is wrong
        send(b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":"')
        for _ in range(64):
            send(b"A" * MIB)
        send(b'"}}\n')
        refused = wait_for(7)
        grown = _hwm_mib(proc.pid) - before
        error = refused["error"]
        assert error["code"] == -32600, refused
        assert "16777216" in error["message"], refused
        assert error["data"]["code"] == "SERVICE.PAYLOAD_TOO_LARGE", refused
        # the line was never held: the peak grew by far less than the line (64 MiB)
        assert grown < 40, f"peak RSS grew {grown} MiB"
        # the server goes on: the next call on the same stream is answered
        send(json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {
            "name": "skill.files.read", "arguments": {"path": "inputs/a.txt"}}}).encode() + b"\n")
        answer = wait_for(8)
        assert answer["result"]["isError"] is False, answer
        assert proc.poll() is None
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert b"Traceback" not in b"".join(stderr)


def test_a_lone_surrogate_is_answered_with_an_error(tmp_path: Path) -> None:
    """``"\\ud800"`` is valid JSON but no text: the SDK's parser dropped such a line without
    its id, and the client waited forever (outsider attack 15, F2: `session.run_code`,
    `session.skill` and `skill.files.read` never answered). It is answered with a JSON-RPC
    error naming where the string is; the next call on the stream is served."""
    policy = _policy_and_root(tmp_path)
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}}).encode(),
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"skill.files.read",'
        b'"arguments":{"path":"inputs/\\ud800"}}}',
        # a surrogate pair is text (an emoji): not refused
        b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"skill.files.read",'
        b'"arguments":{"path":"inputs/\\ud83d\\ude00"}}}',
        b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"skill.files.read",'
        b'"arguments":{"path":"inputs/a.txt"}}}']
    proc = subprocess.Popen(
        [sys.executable, "-m", "policy_engine.cli", "mcp", "--policy", str(policy), "--skills",
         str(ROOT / "skills"), "--state-dir", str(tmp_path / "state"), "--root-fs",
         str(tmp_path / "root"), "--tenant", "acme", "--subject", "agent:x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdin is not None
    assert proc.stdout is not None
    answered: dict[Any, dict[str, Any]] = {}
    try:
        proc.stdin.write(b"\n".join(lines) + b"\n")
        proc.stdin.flush()
        end = time.monotonic() + 60
        while not {9, 10, 11} <= set(answered) and time.monotonic() < end:
            if select.select([proc.stdout], [], [], 0.2)[0]:
                line = proc.stdout.readline()
                if not line:
                    break
                msg = json.loads(line)
                answered[msg.get("id")] = msg
    finally:
        proc.stdin.close()
        proc.wait(30)
    err = proc.stderr.read() if proc.stderr is not None else b""
    assert {9, 10, 11} <= set(answered), (answered, err[-2000:])
    error = answered[9]["error"]
    assert error["code"] == -32602, answered[9]
    assert error["data"]["code"] == "SCHEMA.VALIDATION_FAILED", answered[9]
    assert "/params/arguments/path" in error["message"], answered[9]
    assert "error" not in answered[10], answered[10]  # decided: no such file, a tool error
    assert answered[11]["result"]["isError"] is False, answered[11]
    assert b"Traceback" not in err, err[-2000:]
