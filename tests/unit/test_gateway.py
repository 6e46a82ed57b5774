"""The gateway's parts on their own: one decision per call, the approver's reviewable form, late
and broken approvers, and the one refusal document (its schema in docs/ and OpenAPI)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from policy_engine import PolicyRefusal
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.confirm.broker import ConsentBroker
from policy_engine.confirm.review import MAX_ARG_CHARS, public_url, reviewable
from policy_engine.confirm.services import ConsentAnswer, ConsentRequest
from policy_engine.gateway import Call, Gateway
from policy_engine.guard import Guard
from policy_engine.model import (
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetHttpOp,
    ProcExecOp,
    Settings,
)
from policy_engine.orchestrator import Orchestrator
from policy_engine.refusal import refusal_schema

REPO = Path(__file__).resolve().parents[2]
POLICY = """policy "gateway/unit" version "1.0.0"
permit "read" fs.read  paths ["{root}/**"]
require consent when `request.path.endsWith(".private")`
"""


class CountingGuard(Guard):
    """The real guard, counting its decisions."""

    calls = 0

    def decide(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        CountingGuard.calls += 1
        return super().decide(*args, **kwargs)


class SlowYes:
    """A confirmation service that says yes, but only after its own timeout."""

    mode = "webhook"
    timeout_s = 0.05

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        time.sleep(0.2)
        return ConsentAnswer(True, "user:late", int(time.time() * 1000), 60_000, self.mode,
                             "approved by webhook")


class Broken:
    """A confirmation service that raises (a bug, a lost connection pool)."""

    mode = "webhook"

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        raise RuntimeError("boom")


def _setup(tmp: Path) -> tuple[Orchestrator, Grant, Manifest, Settings]:
    (tmp / "data").mkdir()
    (tmp / "data" / "a.txt").write_text("a\n")
    (tmp / "data" / "b.private").write_text("b\n")
    policy = tmp / "p.sbpolicy"
    policy.write_text(POLICY.format(root=tmp / "data"))
    policyset = compile_files([policy])
    orch = Orchestrator(policyset, config=EngineConfig(state_dir=tmp / "state"),
                        guard=CountingGuard(policyset))
    grant = Grant.model_validate({
        "tenant": "acme", "subject_id": "agent:a", "tool_name": "reader", "call_id": "c-1",
        "expires_at": 4102444800000,
        "capabilities": [{"kind": "fs.read", "paths": [f"{tmp}/data/**"]}]})
    manifest = Manifest.model_validate({
        "name": "reader", "version": "1", "side_effects": ["Read"],
        "permissions": [{"kind": "fs.read", "paths": [f"{tmp}/**"]}]})
    return orch, grant, manifest, Settings(root_fs=str(tmp))


def test_a_call_is_decided_once(tmp_path: Path) -> None:
    orch, grant, manifest, settings = _setup(tmp_path)
    with orch:
        gateway = Gateway(orch)
        CountingGuard.calls = 0
        ran = gateway.run(Call(grant, manifest, FsReadOp(path=f"{tmp_path}/data/a.txt"),
                               settings=settings))
        assert ran.ok
        assert CountingGuard.calls == 1  # the broker no longer runs its own explain first
        CountingGuard.calls = 0
        refused = gateway.run(Call(grant, manifest,
                                   FsReadOp(path=f"{tmp_path}/data/b.private"),
                                   settings=settings))
        assert CountingGuard.calls == 1  # asked about that very decision, not a second one
    assert refused.refusal is not None
    assert refused.refusal.refused_by == "consent"
    assert refused.refusal.consent.answer == "no_service"  # `deny`: nobody to ask


@pytest.mark.parametrize(("service", "kind", "detail"), [
    (SlowYes(), "timed_out", "late: answered after the 0.05s timeout"),
    (Broken(), "no_service", "confirmation failed: RuntimeError")])
def test_a_late_or_broken_approver_is_a_recorded_no(tmp_path: Path, service: Any, kind: str,
                                                    detail: str) -> None:
    orch, grant, manifest, settings = _setup(tmp_path)
    log = tmp_path / "state" / "consent.jsonl"
    with orch:
        called = Gateway(orch, ConsentBroker(service, log)).run(Call(
            grant, manifest, FsReadOp(path=f"{tmp_path}/data/b.private"), settings=settings))
    assert not called.ok
    assert called.outcome.result.code == "SANDBOX.PERMISSION_DENY"
    assert called.refusal is not None
    assert called.refusal.consent.answer == kind
    line = json.loads(log.read_text())
    assert line["envelope_id"] == called.envelope_id
    assert line["answer"]["approved"] is False
    assert line["answer"]["detail"] == detail


def test_the_approver_sees_the_whole_code_bounded_with_a_digest() -> None:
    code = "print('x')\n" * 20_000  # 220 KB of code
    form = reviewable(ProcExecOp(tool="python3", args=("-c", code), env={"TOKEN": "s3cr3t"}))
    assert form["argv"][:2] == ["python3", "-c"]
    assert form["argv"][2] == code[:MAX_ARG_CHARS]
    assert form["truncated"] is True
    assert form["argv_digest"].startswith("sha256:")
    assert form["env_names"] == ["TOKEN"]
    assert "s3cr3t" not in json.dumps(form)  # env values are not for review
    small = reviewable(ProcExecOp(tool="python3", args=("-c", "print(6 * 7)")))
    assert small["argv"] == ["python3", "-c", "print(6 * 7)"]
    assert small["truncated"] is False


def test_the_approver_sees_a_writes_path_digest_and_first_bytes() -> None:
    data = b"#!/bin/sh\necho hi\n" + b"x" * 4096
    form = reviewable(FsWriteOp(path="/w/run.sh", bytes_b64=base64.b64encode(data).decode()))
    assert form["path"] == "/w/run.sh"
    assert form["content"]["size"] == len(data)
    assert form["content"]["first_text"].startswith("#!/bin/sh\necho hi\n")
    assert form["content"]["truncated"] is True
    assert form["content"]["digest"].startswith("sha256:")


def test_the_approver_never_sees_url_credentials() -> None:
    form = reviewable(NetHttpOp(url="https://bob:hunter2@api.example.com/v1?q=1",
                                headers={"Authorization": "Bearer t0ken"}))
    assert form["url"] == "https://api.example.com/v1?q=1"
    assert form["header_names"] == ["Authorization"]
    assert "hunter2" not in json.dumps(form)
    assert "t0ken" not in json.dumps(form)
    assert public_url("http://[::1") == "<unparseable url>"


def test_the_committed_schema_is_the_refusal_document(tmp_path: Path) -> None:
    committed = json.loads((REPO / "docs" / "refusal.schema.json").read_text())
    assert committed == refusal_schema()
    orch, grant, manifest, settings = _setup(tmp_path)
    with orch:
        called = Gateway(orch).run(Call(grant, manifest,
                                        FsReadOp(path=f"{tmp_path}/data/b.private"),
                                        settings=settings))
    assert called.refusal is not None
    doc = called.refusal.to_json()
    jsonschema.validate(doc, committed)
    openapi = json.loads((REPO / "docs" / "openapi.json").read_text())
    body = openapi["components"]["schemas"]["RefusalBody"]
    assert set(body["properties"]) == set(committed["properties"])
    error = PolicyRefusal(called.refusal)
    assert (error.code.value, error.http_status, error.retryable, error.refused_by,
            error.envelope_id) == (doc["code"], doc["http_status"], doc["retryable"],
                                   doc["refused_by"], doc["envelope_id"])
    assert error.consent.answer == doc["consent"]["answer"]
    assert error.to_json() == doc


def test_the_terminal_user_sees_the_code_and_it_cannot_rewrite_the_prompt() -> None:
    import io
    import os

    from policy_engine.confirm.services import InteractiveConfirmation

    sneaky = "import os\nprint('\x1b[2K\x1b[1Aharmless')  # \u202e"
    master, slave = os.openpty()
    os.write(master, b"n\n")
    shown = io.StringIO()
    with os.fdopen(slave, "r") as tty:
        answer = InteractiveConfirmation(stdin=tty, stdout=shown).confirm(ConsentRequest(
            request_id="r", tenant="acme", subject_id="agent:a", tool_name="run_code",
            call_id="c", capability="proc.exec:python3", op={}, reason="consent required",
            requested_at_ms=0, review=reviewable(ProcExecOp(tool="python3",
                                                              args=("-c", sneaky)))))
    os.close(master)
    assert not answer.approved
    text = shown.getvalue()
    assert "import os" in text
    assert "\\u001b[2K" in text  # escaped, not sent to the terminal
    assert "\x1b" not in text
    assert "\u202e" not in text
