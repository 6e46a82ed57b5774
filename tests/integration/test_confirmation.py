"""Human confirmation (seed 001 §4.6) with a real loopback approver: the orchestrator's call goes
through only on a signed yes for that very request; silence, a no, a forged or misdirected answer
all leave it denied, and every answer is recorded beside the evidence."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.confirm.broker import ConsentBroker, consent_notes
from policy_engine.confirm.services import (
    AutoConfirmation,
    ConfirmationService,
    ConsentRequest,
    DenyConfirmation,
    InteractiveConfirmation,
    WebhookConfirmation,
    sign,
)
from policy_engine.gateway import Call, Gateway
from policy_engine.model import FsReadOp, Grant, Manifest, Settings
from policy_engine.orchestrator import Orchestrator
from tests.integration.service_server import add_token, grant, start

pytestmark = pytest.mark.integration
SECRET = b"0123456789abcdef-shared-secret"
POLICY = """policy "confirm/test" version "1.0.0"
permit "read" fs.read  paths ["{root}/**"]
require consent when `request.path.endsWith(".private")`
"""


class Approver:
    """A loopback approver that checks the request's signature and answers as told."""

    def __init__(self) -> None:
        self.mode = "approve"
        self.seen: list[dict[str, object]] = []
        approver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                ts = self.headers.get("x-pe-timestamp", "")
                valid = self.headers.get("x-pe-signature") == sign(SECRET, ts, body)
                request = json.loads(body)
                approver.seen.append({"valid": valid, "request": request})
                if approver.mode == "silent":
                    time.sleep(3)
                rid = "someone-else" if approver.mode == "wrong-id" else request["request_id"]
                answer = json.dumps({"request_id": rid,
                                     "approved": valid and approver.mode != "refuse",
                                     "approver": "user:dana", "valid_for_ms": 60_000}).encode()
                if approver.mode.startswith("dupkey"):
                    # the same key twice (issue 32 attack L3): a reader keeping the last key
                    # sees yes, one keeping the first sees no; `dupkey-no` has the yes first
                    first, last = ("true", "false") if approver.mode == "dupkey-no" \
                        else ("false", "true")
                    answer = (f'{{"request_id": "{rid}", "approved": {first}, '
                              f'"approver": "user:dana", "valid_for_ms": 60000, '
                              f'"approved": {last}}}').encode()
                now = str(int(time.time() * 1000))
                key = b"not-the-secret-at-all" if approver.mode == "forged" else SECRET
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.send_header("x-pe-timestamp", now)
                self.send_header("x-pe-signature", sign(key, now, answer))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/approve"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def approver() -> Iterator[Approver]:
    a = Approver()
    yield a
    a.close()


def _setup(tmp: Path) -> tuple[Path, Grant, Manifest, Orchestrator]:
    (tmp / "data").mkdir()
    (tmp / "data" / "notes.private").write_text("private notes\n")
    (tmp / "data" / "open.txt").write_text("open\n")
    policy = tmp / "p.sbpolicy"
    policy.write_text(POLICY.format(root=tmp / "data"))
    policyset = compile_files([policy])
    g = Grant.model_validate({"tenant": "acme", "subject_id": "agent:a", "tool_name": "reader",
                              "call_id": "c-1", "expires_at": 4102444800000,
                              "capabilities": [{"kind": "fs.read",
                                                "paths": [f"{tmp}/data/**"]}]})
    m = Manifest.model_validate({"name": "reader", "version": "1", "side_effects": ["Read"],
                                 "permissions": [{"kind": "fs.read",
                                                  "paths": [f"{tmp}/**"]}]})
    orch = Orchestrator(policyset, config=EngineConfig(state_dir=tmp / "state"))
    return tmp, g, m, orch


def _call(tmp: Path, service: ConfirmationService, name: str = "notes.private"
          ) -> tuple[bool, str | None, list[dict[str, object]]]:
    tmp, g, m, orch = _setup(tmp)
    settings = Settings(root_fs=str(tmp))
    broker = ConsentBroker(service, tmp / "state" / "consent.jsonl")
    op = FsReadOp(path=f"{tmp}/data/{name}")
    with orch:
        called = Gateway(orch, broker).run(Call(g, m, op, settings=settings))
    outcome, asked = called.outcome, called.asked
    # the evidence of the call carries the same question and answer as the consent log
    assert outcome.begin.annotations == consent_notes(asked)
    log = tmp / "state" / "consent.jsonl"
    lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    for line in lines:
        assert line["envelope_id"] == outcome.envelope_id
    return outcome.result.ok, outcome.result.code, lines


def test_a_signed_yes_lets_the_call_run_and_is_recorded(tmp_path: Path,
                                                        approver: Approver) -> None:
    ok, code, lines = _call(tmp_path, WebhookConfirmation(approver.url, SECRET, timeout_s=5))
    assert ok, code
    assert approver.seen[0]["valid"] is True  # the request was signed with the shared secret
    asked = approver.seen[0]["request"]
    assert isinstance(asked, dict)
    assert asked["tenant"] == "acme"
    assert asked["reason"].startswith("consent required")
    answer = lines[0]["answer"]
    assert answer["approved"] is True
    assert answer["approver"] == "user:dana"
    assert answer["valid_for_ms"] == 60_000
    assert answer["mode"] == "webhook"


@pytest.mark.parametrize("mode", ["refuse", "wrong-id", "forged"])
def test_anything_but_a_signed_yes_for_this_request_denies(tmp_path: Path, approver: Approver,
                                                           mode: str) -> None:
    approver.mode = mode
    ok, code, lines = _call(tmp_path, WebhookConfirmation(approver.url, SECRET, timeout_s=5))
    assert not ok
    assert code == "SANDBOX.PERMISSION_DENY"
    assert lines[0]["answer"]["approved"] is False
    assert approver.seen  # it was asked


@pytest.mark.parametrize("mode", ["dupkey", "dupkey-no"])
def test_a_signed_answer_with_a_duplicated_key_is_a_no(tmp_path: Path, approver: Approver,
                                                       mode: str) -> None:
    """Issue 32 attack L3: ``{"approved": false, ..., "approved": true}``, correctly signed, is
    ambiguous (the last key wins in Python, the first in other readers), so it is garbage: a
    no recorded as ``no_service`` with the reason, and the file is not read."""
    approver.mode = mode
    ok, code, lines = _call(tmp_path, WebhookConfirmation(approver.url, SECRET, timeout_s=5))
    assert approver.seen
    assert approver.seen[0]["valid"] is True
    assert not ok
    assert code == "SANDBOX.PERMISSION_DENY"
    answer = lines[0]["answer"]
    assert answer["approved"] is False
    assert "duplicate key `approved`" in answer["detail"]
    assert answer["kind"] == "no_service"


def test_silence_until_the_timeout_denies(tmp_path: Path, approver: Approver) -> None:
    approver.mode = "silent"
    started = time.monotonic()
    ok, code, lines = _call(tmp_path, WebhookConfirmation(approver.url, SECRET, timeout_s=0.5))
    assert time.monotonic() - started < 2.5
    assert not ok
    assert code == "SANDBOX.PERMISSION_DENY"
    assert lines[0]["answer"]["timed_out"] is True
    assert "timed_out" in lines[0]["answer"]["detail"]


def test_no_consent_needed_asks_nobody(tmp_path: Path, approver: Approver) -> None:
    ok, _, lines = _call(tmp_path, WebhookConfirmation(approver.url, SECRET), name="open.txt")
    assert ok
    assert approver.seen == []
    assert lines == []


def test_deny_is_the_default_and_auto_is_loud(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "deny").mkdir()
    ok, code, lines = _call(tmp_path / "deny", DenyConfirmation())
    assert not ok
    assert code == "SANDBOX.PERMISSION_DENY"
    assert lines[0]["answer"]["approver"] == "policy-engine:deny"
    (tmp_path / "auto").mkdir()
    with caplog.at_level(logging.WARNING):
        ok, _, lines = _call(tmp_path / "auto", AutoConfirmation())
    assert ok
    assert lines[0]["answer"]["approver"] == "auto"
    assert any("AUTO-APPROVED" in r.getMessage() for r in caplog.records)


def test_interactive_asks_on_a_real_terminal(tmp_path: Path) -> None:
    master, slave = os.openpty()
    os.write(master, b"y\n")
    with os.fdopen(slave, "r") as tty, open(os.devnull, "w") as out:
        service = InteractiveConfirmation(stdin=tty, stdout=out, who="user:tty")
        ok, _, lines = _call(tmp_path, service)
    os.close(master)
    assert ok
    assert lines[0]["answer"]["approver"] == "user:tty"
    with open(os.devnull) as not_a_tty:
        assert InteractiveConfirmation(stdin=not_a_tty).confirm(
            _question()).approved is False


def _question() -> ConsentRequest:
    return ConsentRequest("r", "t", "s", "tool", "c", "fs.read", {}, "consent required", 0)


def test_the_service_asks_the_webhook_for_ops(tmp_path: Path, approver: Approver) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    root = tmp_path / "svc"
    root.mkdir()
    with start(root, "--confirmation", "webhook", "--approver-url", approver.url,
               "--approver-secret-file", str(secret), "--approver-timeout", "5") as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        policy_needs = svc.root / "svc.sbpolicy"
        assert "High" in policy_needs.read_text()  # the service policy: consent for High only
        body = {"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                "grant": grant("acme", "agent:alice", root, tool_name="reader-high"),
                "manifest": "reader-high"}
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=30) as c:
            approved = c.post("/v1/ops", json=body)
            approver.mode = "refuse"
            refused = c.post("/v1/ops", json=body)
    assert approved.status_code == 200, approved.text
    assert approved.json()["consent"]["approver"] == "user:dana"
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "SANDBOX.PERMISSION_DENY"
    assert refused.json()["consent"]["approved"] is False
    records = (svc.state / "consent.jsonl").read_text().splitlines()
    assert len(records) == 2
    begins = {r["envelope_id"]: r for r in map(json.loads, (
        svc.state / "evidence" / "evidence.jsonl").read_text().splitlines())
        if r["type"] == "begin"}
    for line in map(json.loads, records):  # every answer is in the call's evidence too
        notes = begins[line["envelope_id"]]["annotations"]
        assert notes["consent"]["answer"] == line["answer"]
        assert notes["consent"]["request"]["tenant"] == "acme"
