"""Orchestrator sequence: evidence on every path, code mapping, budgets, timeouts, redaction."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from orchestrator_fixtures import (
    MANIFEST,
    NOW,
    ScriptedExecutor,
    ScriptedGuard,
    grant,
    orchestrator,
    profile,
)

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.evidence import inputs_digest, load_or_create_key
from policy_engine.evidence.redact import key_id, keyed_digest
from policy_engine.executor import CancelToken
from policy_engine.model import Budget, FsReadOp, FsWriteOp, ProcExecOp, TmpAllocOp, Usage
from policy_engine.orchestration import MemoryRevocationList


def records(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "evidence" / "evidence.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if r.get("type") != "checkpoint"]  # signed at close by default


def test_allowed_call_writes_begin_and_end_with_seed_004_fields(tmp_path: Path) -> None:
    ex = ScriptedExecutor("fs-test")
    ex.used = Usage(bytes_in=10, file_count=1)
    op = FsReadOp(path="/workspace/a.txt")
    with orchestrator(tmp_path, ex) as orch:
        out = orch.run(grant(), MANIFEST, op)
        exec_total = orch.metrics.sample("sandbox_exec_total", {
            "domain": "fs", "tool": "t", "safety": "Low", "side_effect": "Read",
            "tenant": "acme"})
        used_in = orch.metrics.sample("sandbox_budget_used_bytes_total", {"direction": "in"})
    assert out.result.ok
    assert out.result.out == {"digest": "d"}
    assert out.result.used == Usage(calls=1, bytes_in=10, file_count=1)
    begin, end = records(tmp_path)
    assert begin["type"] == "begin"
    assert end["type"] == "end"
    assert begin["envelope_id"] == end["envelope_id"] == out.envelope_id
    assert begin["capability"] == "fs.read:/workspace/a.txt"
    assert begin["inputs_digest"] == inputs_digest(op).model_dump(mode="json")
    assert begin["produced_at_ms"] == NOW
    assert begin["policy_version_hash"] == "ph-test"
    assert end["status"] == "ok"
    assert end["sandbox_success"] is True
    assert end["sandbox_backend"] == "fs-test"
    assert end["sandbox_network_mode"] == "off"
    assert end["sandbox_profile"].startswith("default:")
    assert end["sandbox_degraded"] is False
    assert end["sandbox_latency_ms"] >= 0
    assert end["budget_used"]["calls"] == 1
    assert (exec_total, used_in) == (1.0, 10.0)


def test_guard_denial_still_writes_begin_and_end(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    guard = ScriptedGuard({"fs.read": ErrorCode.CAPABILITY_BLOCKED.value})
    with orchestrator(tmp_path, ex, guard=guard) as orch:
        out = orch.run(grant(), MANIFEST, FsReadOp(path="/etc/shadow"))
        denied = orch.metrics.sample("sandbox_denied_total", {"code": "SANDBOX.CAPABILITY_BLOCKED"})
    assert not out.result.ok
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert out.decision.decision == "deny"
    assert ex.calls == 0
    begin, end = records(tmp_path)
    assert begin["profile_hash"] == "hash-1"
    assert (end["status"], end["error_code"]) == ("denied", "SANDBOX.CAPABILITY_BLOCKED")
    assert end["sandbox_success"] is False
    assert denied == 1.0


@pytest.mark.parametrize("case", ["expired", "revoked_call", "revoked_fingerprint"])
def test_expired_or_revoked_grant_is_refused_with_evidence(tmp_path: Path, case: str) -> None:
    ex = ScriptedExecutor()
    g = grant(expires_at=NOW - 1 if case == "expired" else NOW + 1000, fingerprint="fp-9")
    with orchestrator(tmp_path, ex) as orch:
        if case != "expired":
            revocations = orch.revocations
            assert isinstance(revocations, MemoryRevocationList)
            revocations.revoke("c1" if case == "revoked_call" else "fp-9")
        out = orch.run(g, MANIFEST, FsReadOp(path="/workspace/a"))
    assert out.result.code == "SANDBOX.PERMISSION_DENY"
    assert ex.calls == 0
    assert out.result.message in ("permission denied: grant expired",
                                  "permission denied: grant revoked")
    begin, end = records(tmp_path)
    assert begin["profile_hash"] == ""
    assert end["status"] == "denied"


def test_call_budget_refuses_the_call_over_the_limit(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    g = grant(budget=Budget(calls=2))
    with orchestrator(tmp_path, ex) as orch:
        outs = [orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1)) for _ in range(3)]
    assert [o.result.ok for o in outs] == [True, True, False]
    assert outs[2].result.code == "QUOTA.BUDGET_EXCEEDED"
    assert ex.calls == 2
    assert records(tmp_path)[-1]["status"] == "denied"


def test_unexpected_executor_exception_is_execution_failed_without_detail(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    ex.raise_exc = RuntimeError("token sk-live-123 leaked in /secret/path")
    with orchestrator(tmp_path, ex) as orch:
        out = orch.run(grant(), MANIFEST, TmpAllocOp(size_bytes=1))
        errors = orch.metrics.sample("sandbox_errors_total", {"code": "TOOL.EXECUTION_FAILED"})
    assert out.result.code == "TOOL.EXECUTION_FAILED"
    assert "sk-live" not in (out.result.message or "")
    assert errors == 1.0
    assert "sk-live" not in (tmp_path / "evidence" / "evidence.jsonl").read_text()
    end = records(tmp_path)[-1]
    assert (end["status"], end["sandbox_error_kind"]) == ("error", "exception")


def test_policy_engine_error_from_executor_keeps_its_code(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    ex.raise_exc = PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, "symlink refused")
    with orchestrator(tmp_path, ex) as orch:
        out = orch.run(grant(), MANIFEST, FsReadOp(path="/workspace/l"))
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert out.result.message == "blocked by sandbox policy: symlink refused"


def test_wall_timeout_is_llm_timeout_even_if_executor_ignores_cancel(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    ex.sleep_s, ex.honour_cancel = 0.5, False
    with orchestrator(tmp_path, ex, prof=profile(timeout_ms=50)) as orch:
        out = orch.run(grant(), MANIFEST, TmpAllocOp(size_bytes=1))
    assert out.result.code == "LLM.TIMEOUT"
    end = records(tmp_path)[-1]
    assert end["sandbox_timed_out"] is True
    assert end["sandbox_error_kind"] == "timeout"


def test_cancellation_maps_to_execution_failed_cancelled(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    ex.sleep_s = 5.0
    token = CancelToken()
    threading.Timer(0.05, token.cancel).start()
    with orchestrator(tmp_path, ex) as orch:
        out = orch.run(grant(), MANIFEST, TmpAllocOp(size_bytes=1), cancel=token)
    assert out.result.code == "TOOL.EXECUTION_FAILED"
    assert out.result.message == "tool execution failed: cancelled"
    end = records(tmp_path)[-1]
    assert (end["sandbox_error_kind"], end["sandbox_timed_out"]) == ("cancelled", False)


def test_streamed_and_reported_usage_are_charged_against_the_budget(tmp_path: Path) -> None:
    streaming = ScriptedExecutor()
    streaming.consume = [("bytes_in", 60), ("bytes_in", 60)]
    g = grant(budget=Budget(bytes_in=100))
    with orchestrator(tmp_path, streaming) as orch:
        out = orch.run(g, MANIFEST, TmpAllocOp(size_bytes=1))
        assert out.result.code == "QUOTA.BUDGET_EXCEEDED"
        assert orch.meter.used("acme/agent:1/c1") == {"calls": 1, "bytes_in": 60}
    reporting = ScriptedExecutor()
    reporting.used = Usage(bytes_out=500)
    with orchestrator(tmp_path / "b", reporting) as orch:
        out = orch.run(grant(budget=Budget(bytes_out=100)), MANIFEST, TmpAllocOp(size_bytes=1))
    assert out.result.code == "QUOTA.BUDGET_EXCEEDED"
    assert out.result.out == {}


def test_evidence_never_holds_written_content_or_env_values(tmp_path: Path) -> None:
    ex = ScriptedExecutor(caps={"resource_limits": True, "env_filtering": True,
                                "bind_mounts": True, "readonly_rootfs": True,
                                "mandatory_denies": True})
    ex.out = {"exit_code": 0, "stdout_truncated": True}
    secret = b"PASSWORD=hunter2-correct-horse"
    with orchestrator(tmp_path, ex) as orch:
        orch.run(grant(), MANIFEST, FsWriteOp(path="/workspace/w",
                                               bytes_b64=base64.b64encode(secret).decode()))
        orch.run(grant(), MANIFEST, ProcExecOp(tool="git", args=("status",),
                                                env={"API_TOKEN": "tok-abcdef-999"}))
    text = (tmp_path / "evidence" / "evidence.jsonl").read_text()
    assert "hunter2" not in text
    assert base64.b64encode(secret).decode() not in text
    assert "tok-abcdef-999" not in text
    assert "API_TOKEN" in text
    proc_end = records(tmp_path)[-1]
    meta = proc_end["side_effects"][0]["meta"]
    # no template allowed this call here, so the argument is a size and a keyed digest only
    key = load_or_create_key(tmp_path)
    assert meta == {"cmd": "git", "argc": 1, "args": [{"size": 6,
                                                        "hmac": keyed_digest(key, "status")}],
                    "cwd": None, "env_keys": ["API_TOKEN"], "hmac_key": key_id(key),
                    "exit_code": 0, "stdout_truncated": True}


def test_missing_configured_sink_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="evidence sink `nowhere`"):
        orchestrator(tmp_path, ScriptedExecutor(), evidence_sinks=("nowhere",))
