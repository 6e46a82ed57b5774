"""`policy-engine lsp` under hostile framing and requests (fuzz round 2, issue 32.11): a
Content-Length past 2^63 or over the frame bound, a request on a never-opened `file:///dev/zero`,
and internal-error replies. The real server over stdio, spoken to frame by frame."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 1024 * 1024 * 1024  # the fuzzer's RLIMIT_AS


def frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


class Server:
    """The server as a child process with RLIMIT_AS 1 GiB; replies read on a thread."""

    def __init__(self, root: Path | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "policy_engine.cli", "lsp"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, preexec_fn=_limit)
        self.replies: dict[int, dict[str, Any]] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        params: dict[str, Any] = {"capabilities": {}, "processId": None}
        if root is not None:
            params["rootUri"] = root.as_uri()
        self.request(1, "initialize", params)
        self.send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            header = out.readline()
            if not header:
                return
            if header.lower().startswith(b"content-length:"):
                size = int(header.split(b":")[1])
                while out.readline().strip():  # to the blank line that ends the headers
                    pass
                msg = json.loads(out.read(size))
                if "id" in msg and "method" not in msg:
                    with self.cond:
                        self.replies[msg["id"]] = msg
                        self.cond.notify_all()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, rid: int, method: str, params: dict[str, Any],
                wait: float = 30.0) -> dict[str, Any]:
        self.send(frame({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        with self.cond:
            assert self.cond.wait_for(lambda: rid in self.replies, wait), \
                f"no reply to {method}; stderr: {self.stop()}"
            return self.replies[rid]

    def stop(self) -> str:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")


def symbols(uri: str) -> dict[str, Any]:
    return {"textDocument": {"uri": uri}}


def test_content_length_past_2_63_does_not_kill_the_server() -> None:
    server = Server()
    server.send(b"Content-Length: 99999999999999999999\r\n\r\n")
    server.send(b"x" * 100)
    stderr = server.stop()  # end of input while the frame is being dropped: a clean exit
    assert server.proc.returncode == 0, stderr
    assert "OverflowError" not in stderr
    assert "UNKNOWN.INTERNAL" not in stderr
    assert "Content-Length 99999999999999999999, over the 16777216-byte bound" in stderr


def test_an_oversized_frame_is_dropped_and_the_session_goes_on(tmp_path: Path) -> None:
    server = Server()
    big = b'{"jsonrpc": "2.0", "method": "x", "params": "' + b"a" * (17 * 1024 * 1024) + b'"}'
    server.send(b"Content-Length: %d\r\n\r\n" % len(big) + big)
    server.send(b"X-Junk: " + b"h" * 100_000 + b"\r\n")  # an overlong header line, skipped
    policy = tmp_path / "p.sbpolicy"
    text = 'policy "p" version "1.0.0"\npermit "r" fs.read paths ["/workspace/**"]\n'
    server.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
        "textDocument": {"uri": policy.as_uri(), "languageId": "sbpolicy", "version": 1,
                         "text": text}}}))
    reply = server.request(2, "textDocument/documentSymbol", symbols(policy.as_uri()))
    assert [s["name"] for s in reply["result"]][:1] == ["p"]
    stderr = server.stop()
    assert server.proc.returncode == 0, stderr


def test_a_never_opened_dev_zero_is_not_read() -> None:
    server = Server()
    for rid, method in ((2, "textDocument/documentSymbol"), (3, "textDocument/formatting")):
        params: dict[str, Any] = symbols("file:///dev/zero")
        if method == "textDocument/formatting":
            params["options"] = {"tabSize": 2, "insertSpaces": True}
        reply = server.request(rid, method, params)
        assert reply["error"]["code"] == -32602, reply
        assert "is not open and not under the workspace" in reply["error"]["message"]
        assert "data" not in reply["error"]  # no traceback reaches the client
    reply = server.request(4, "textDocument/hover", {**symbols("file:///etc/shadow"),
                                                     "position": {"line": 0, "character": 0}})
    assert "is not open and not under the workspace" in reply["error"]["message"]
    stderr = server.stop()
    assert server.proc.returncode == 0, stderr
    assert "MemoryError" not in stderr
    assert "Traceback" not in stderr  # a refusal on purpose is one log line


def test_files_under_the_workspace_are_read_bounded(tmp_path: Path) -> None:
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "ws" version "1.0.0"\n')
    fifo = tmp_path / "pipe.sbpolicy"
    os.mkfifo(fifo)
    server = Server(root=tmp_path)
    reply = server.request(2, "textDocument/documentSymbol", symbols(policy.as_uri()))
    assert reply["result"][0]["name"] == "ws"
    reply = server.request(3, "textDocument/documentSymbol", symbols(fifo.as_uri()))
    assert "not a regular file" in reply["error"]["message"]
    assert "data" not in reply["error"]
    server.stop()
