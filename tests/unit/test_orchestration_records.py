"""The begin and end records, results and usage the orchestrator assembles without validating
again (orchestration/records.py) are the objects validation builds: the same fields, fields
set, JSON bytes and log lines, for calls that ran, were refused at each step, or failed; and a
value of another type than its field's is validated as before."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.model import (
    Digest,
    EvidenceBegin,
    EvidenceEnd,
    ExecOp,
    ExecResult,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    ProcExecOp,
    Settings,
    SideEffect,
    SideEffectRec,
    Usage,
)
from policy_engine.orchestration.records import (
    begin_record,
    end_record,
    failed_result,
    ok_result,
    usage_of,
)
from policy_engine.orchestration.revocation import MemoryRevocationList
from policy_engine.orchestrator import Orchestrator, RunOutcome


def _validated(model: BaseModel) -> BaseModel:
    """``model`` built again the validated way, from the fields it was given."""
    cls = type(model)
    return cls(**{k: getattr(model, k) for k in model.model_fields_set})


def _same(model: BaseModel) -> None:
    again = _validated(model)
    assert type(model) is type(again)
    assert list(model.__dict__) == list(again.__dict__) == list(type(model).model_fields)
    assert model.__dict__ == again.__dict__
    assert model.model_fields_set == again.model_fields_set
    assert model.__pydantic_extra__ == again.__pydantic_extra__
    assert model.__pydantic_private__ == again.__pydantic_private__
    assert model.model_dump_json() == again.model_dump_json()
    assert model == again


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Orchestrator, MemoryRevocationList]:
    ws = tmp_path / "ws"
    (ws / "work").mkdir(parents=True)
    (ws / "secret").mkdir()
    (ws / "README.md").write_text("hello\n")
    (ws / "secret" / "k").write_text("k\n")
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(f'policy "t/records" version "1.0.0"\n'
                      f'permit "read" fs.read, fs.list paths ["{ws}/**"]\n'
                      f'permit "write" fs.write paths ["{ws}/work/**"]\n'
                      f'forbid "secret" fs.read paths ["{ws}/secret/**"]\n')
    revoked = MemoryRevocationList()
    orch = Orchestrator(compile_files([policy]), revocations=revoked,
                        config=EngineConfig(state_dir=tmp_path / "state"))
    return ws, orch, revoked


def _grant(ws: Path, call_id: str = "c1", **extra: Any) -> Grant:
    return Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "rw", "call_id": call_id,
        "expires_at": 4102444800000,
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4102444800000},
        **extra,
        "capabilities": [{"kind": k, "paths": [f"{ws}/**"]}
                         for k in ("fs.read", "fs.list", "fs.write")]})


def _manifest(ws: Path) -> Manifest:
    return Manifest.model_validate({
        "name": "rw", "version": "1", "side_effects": ["Read", "Write"], "safety_class": "Low",
        "permissions": [{"kind": k, "paths": [f"{ws}/**"]}
                        for k in ("fs.read", "fs.list", "fs.write")]})


def _calls(ws: Path) -> list[tuple[str, Grant, ExecOp, dict[str, Any]]]:
    data = base64.b64encode(b"data").decode()
    return [
        ("read", _grant(ws), FsReadOp(path=f"{ws}/README.md"), {}),
        ("read part", _grant(ws), FsReadOp(path=f"{ws}/README.md", offset=1, len=2), {}),
        ("list", _grant(ws), FsListOp(path=str(ws), depth=2), {}),
        ("write", _grant(ws), FsWriteOp(path=f"{ws}/work/o.txt", bytes_b64=data), {}),
        ("forbidden", _grant(ws), FsReadOp(path=f"{ws}/secret/k"), {}),
        ("not granted", _grant(ws), FsWriteOp(path=f"{ws}/README.md", bytes_b64=data), {}),
        ("missing", _grant(ws), FsReadOp(path=f"{ws}/nope.txt"), {}),
        ("expired", _grant(ws, expires_at=1), FsReadOp(path=f"{ws}/README.md"), {}),
        ("revoked", _grant(ws, "gone"), FsReadOp(path=f"{ws}/README.md"), {}),
        ("no backend", _grant(ws), ProcExecOp(tool="bash", args=["-c", "true"]), {}),
        ("annotated", _grant(ws), FsReadOp(path=f"{ws}/README.md"),
         {"annotations": {"risk": {"level": "low", "patterns": []}}}),
        ("odd name", _grant(ws), FsReadOp(path=f"{ws}/\u00e9\u20ac \"q\"\\.txt"), {}),
    ]


def test_every_record_of_every_call_is_the_validated_one(
        world: tuple[Path, Orchestrator, MemoryRevocationList]) -> None:
    ws, orch, revoked = world
    revoked.revoke("gone")
    outcomes: list[RunOutcome] = []
    with orch:
        for _name, grant, op, extra in _calls(ws):
            outcomes.append(orch.run(grant, _manifest(ws), op,
                                     settings=Settings(root_fs=str(ws)), **extra))
    assert [o.result.ok for o in outcomes][:4] == [True] * 4, [o.result for o in outcomes]
    assert not any(o.result.ok for o in outcomes[4:10])
    logged = [line for line in (orch.config.state_dir / "evidence" / "evidence.jsonl")
              .read_bytes().splitlines() if b'"type":"checkpoint"' not in line]
    assert len(logged) == 2 * len(outcomes)
    pairs = zip(logged[::2], logged[1::2], strict=True)
    for outcome, (begin_line, end_line) in zip(outcomes, pairs,
                                               strict=True):
        for model in (outcome.begin, outcome.end, outcome.result, outcome.result.used):
            _same(model)
        # the log holds the validated records' bytes, chained
        assert begin_line.startswith(_validated(outcome.begin).model_dump_json()
                                     .encode()[:-1] + b',"chain":')
        assert end_line.startswith(_validated(outcome.end).model_dump_json()
                                   .encode()[:-1] + b',"chain":')
        assert outcome.end.budget_used is outcome.result.used


def test_a_value_of_another_type_is_validated_as_before() -> None:
    digest = Digest.of(b"x")
    end = {"envelope_id": "e", "status": "ok", "error_code": None, "outputs_digest": digest,
           "side_effects": ({"kind": "Read", "meta": {"op": "fs.read"}},),
           "budget_used": Usage(), "finished_at_ms": 1000.0, "sandbox_backend": "fs",
           "sandbox_profile": None, "sandbox_network_mode": None, "sandbox_latency_ms": 1,
           "sandbox_timed_out": False, "sandbox_success": True, "sandbox_error_kind": None,
           "sandbox_degraded": False, "sandbox_degrade_reason": None, "decision": "allow",
           "rule": None, "policy_version_hash": "h", "reason": None, "limits": None,
           "timeout_ms": None}
    built = end_record(end)
    assert built.finished_at_ms == 1000
    assert type(built.finished_at_ms) is int
    assert built.side_effects == (SideEffectRec(kind=SideEffect.READ,
                                                meta={"op": "fs.read"}),)
    assert b'"finished_at_ms":1000,' in built.json_bytes()
    assert b'"sandbox_latency_ms":1.0,' in built.json_bytes()
    begin = {"envelope_id": "e", "tenant": "t", "subject_id": "s", "tool_name": "x",
             "call_id": "c", "profile_hash": "", "capability": "fs.read:/a",
             "inputs_digest": digest, "produced_at_ms": 5, "policy_version_hash": "h",
             "replay": None, "shadow": None, "annotations": {1: "not a name"}}
    with pytest.raises(ValueError, match="annotations"):
        begin_record(begin)
    assert usage_of({"calls": 1.0, "bytes_out": 0, "bytes_in": 2, "cpu_ms": 0, "gpu_ms": 0,
                     "file_count": 0}).model_dump() == Usage(calls=1, bytes_in=2).model_dump()
    assert type(usage_of({"calls": 1.0, "bytes_out": 0, "bytes_in": 2, "cpu_ms": 0,
                          "gpu_ms": 0, "file_count": 0}).calls) is int


@pytest.mark.parametrize("build", [
    lambda: Digest.of(b""),
    lambda: Digest.of(b"\x00" * 70_000),
    lambda: ok_result({"path": "/a", "n": [1, 2]}, Usage(calls=1)),
    lambda: failed_result("SANDBOX.PERMISSION_DENY", "permission denied: x", Usage()),
    lambda: usage_of({"calls": 1, "bytes_out": 2, "bytes_in": 3, "cpu_ms": 4, "gpu_ms": 5,
                      "file_count": 6}),
    lambda: begin_record({"envelope_id": "e", "tenant": "t", "subject_id": "s",
                          "tool_name": "x", "call_id": "c", "profile_hash": "p",
                          "capability": "fs.read:/a", "inputs_digest": Digest.of(b"a"),
                          "produced_at_ms": 5, "policy_version_hash": "h",
                          "replay": {"v": 1, "op": {"kind": "fs.read"}},
                          "shadow": {"decision": "deny"}, "annotations": None}),
])
def test_each_builder_makes_the_validated_model(build: Any) -> None:
    model = build()
    assert type(model) in (Digest, ExecResult, Usage, EvidenceBegin, EvidenceEnd)
    _same(model)
    assert json.loads(model.model_dump_json()) == model.model_dump(mode="json")


@pytest.mark.parametrize("size", [0, 6, 70_000])
def test_the_fs_readers_assembled_result_is_the_validated_one(tmp_path: Path, size: int
                                                               ) -> None:
    from tests.unit.test_executor_fs import ctx_for, fs

    (tmp_path / "f.bin").write_bytes(b"x" * size)
    ctx = ctx_for(tmp_path)
    result = fs(True).execute(ctx, FsReadOp(path=f"{tmp_path}/f.bin"))
    assert result.out["size"] == size
    for model in (result, result.used, *ctx.side_effects):
        _same(model)
