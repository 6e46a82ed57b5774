"""Issue 32 item 7: the webhook approver's timeout bounds the whole exchange (connect, request,
status line, headers, body). A loopback approver that answers a valid signed yes but trickles
it (headers at once then the body a byte at a time, or the headers themselves slowly) is a no
at the timeout, recorded ``timed_out``, and the call stays denied; a prompt yes still works.
Real sockets on loopback, the real orchestrator and consent log."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.confirm.services import WebhookConfirmation, sign
from tests.integration.service_server import add_token, grant, start
from tests.integration.test_confirmation import SECRET, _call

pytestmark = pytest.mark.integration


def _answer(lines: list[dict[str, object]]) -> dict[str, Any]:
    answer = lines[0]["answer"]
    assert isinstance(answer, dict)
    return answer


class TrickleApprover:
    """Answers every request with a correctly signed yes, written as ``mode`` says: ``prompt``
    at once, ``body`` (status and headers at once, then the body a byte per ``gap_s``),
    ``headers`` (the response a byte per ``gap_s`` from its first line)."""

    def __init__(self, mode: str, gap_s: float) -> None:
        self.mode, self.gap_s = mode, gap_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/approve"
        self.closed_early = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            request = json.loads(body)
            answer = json.dumps({"request_id": request["request_id"], "approved": True,
                                 "approver": "user:slow", "valid_for_ms": 60_000}).encode()
            now = str(int(time.time() * 1000))
            top = (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                   f"content-length: {len(answer)}\r\nx-pe-timestamp: {now}\r\n"
                   f"x-pe-signature: {sign(SECRET, now, answer)}\r\n\r\n").encode()
            try:
                if self.mode == "prompt":
                    conn.sendall(top + answer)
                    return
                if self.mode == "body":
                    conn.sendall(top)
                slow = answer if self.mode == "body" else top + answer
                for i in range(len(slow)):
                    conn.sendall(slow[i:i + 1])
                    time.sleep(self.gap_s)
            except OSError:
                self.closed_early.set()  # the client hung up: it stopped waiting

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def trickle(request: pytest.FixtureRequest) -> Iterator[TrickleApprover]:
    mode, gap = request.param
    a = TrickleApprover(mode, gap)
    yield a
    a.close()


@pytest.mark.parametrize("trickle", [("body", 0.05), ("headers", 0.05), ("body", 2.0)],
                         indirect=True, ids=["body-fast-bytes", "headers-fast-bytes",
                                             "body-2s-per-byte"])
def test_an_answer_that_ends_after_the_timeout_is_a_timed_out_no(
        tmp_path: Path, trickle: TrickleApprover) -> None:
    started = time.monotonic()
    ok, code, lines = _call(tmp_path, WebhookConfirmation(trickle.url, SECRET, timeout_s=1.0))
    took = time.monotonic() - started
    assert not ok  # the signed yes arrived (whole) only seconds after the timeout
    assert code == "SANDBOX.PERMISSION_DENY"
    answer = _answer(lines)
    assert answer["approved"] is False
    assert answer["timed_out"] is True
    assert "1 s" in answer["detail"]
    assert took < 3.0, took  # the whole exchange, not each read, is bounded
    assert trickle.closed_early.wait(5)  # and the connection was dropped, not left hanging


@pytest.mark.parametrize("trickle", [("prompt", 0.0)], indirect=True)
def test_a_prompt_signed_yes_still_approves(tmp_path: Path, trickle: TrickleApprover) -> None:
    ok, _, lines = _call(tmp_path, WebhookConfirmation(trickle.url, SECRET, timeout_s=1.0))
    assert ok
    assert _answer(lines)["approver"] == "user:slow"
    assert _answer(lines)["timed_out"] is False


def test_an_unreachable_approver_is_a_no_that_did_not_time_out(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again: nothing listens there
    ok, _, lines = _call(tmp_path, WebhookConfirmation(f"http://127.0.0.1:{port}/a", SECRET,
                                                       timeout_s=1.0))
    assert not ok
    assert _answer(lines)["timed_out"] is False
    assert "unreachable" in _answer(lines)["detail"]


@pytest.mark.parametrize("trickle", [("body", 0.2)], indirect=True)
def test_the_service_refuses_a_trickled_approval_at_its_timeout(
        tmp_path: Path, trickle: TrickleApprover) -> None:
    """The red team's a10 through `serve --approver-timeout`: was approved 22 s late."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    root = tmp_path / "svc"
    root.mkdir()
    with start(root, "--confirmation", "webhook", "--approver-url", trickle.url,
               "--approver-secret-file", str(secret), "--approver-timeout", "1") as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        body = {"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                "grant": grant("acme", "agent:alice", root, tool_name="reader-high"),
                "manifest": "reader-high"}
        with svc.client(token) as c:
            started = time.monotonic()
            refused = c.post("/v1/ops", json=body)
            took = time.monotonic() - started
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "SANDBOX.PERMISSION_DENY"
    assert refused.json()["consent"]["timed_out"] is True
    assert took < 3.0, took
    line = json.loads((svc.state / "consent.jsonl").read_text().splitlines()[-1])
    assert line["answer"]["timed_out"] is True
    assert line["answer"]["approved"] is False
