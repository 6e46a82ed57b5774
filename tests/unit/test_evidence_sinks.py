"""Evidence sinks (JSONL, SQLite), the spool-and-retry wrapper and the digest helpers."""

from __future__ import annotations

import base64
import json
import sqlite3
import time
from pathlib import Path

import pytest
from orchestrator_fixtures import MANIFEST, ScriptedExecutor, grant, orchestrator

from plugins.evidence_jsonl import JsonlSink
from plugins.evidence_sqlite import SqliteSink
from policy_engine.config import EngineConfig
from policy_engine.evidence import (
    SpoolingSink,
    canonical_json,
    capability_string,
    inputs_digest,
    redacted_op,
)
from policy_engine.evidence.chain import strip_chain
from policy_engine.hookspecs import hookimpl
from policy_engine.model import (
    Digest,
    EvidenceBegin,
    EvidenceEnd,
    FsWriteOp,
    NetHttpOp,
    ProcExecOp,
    SideEffect,
    SideEffectRec,
    TmpAllocOp,
)


def begin(envelope: str = "e1") -> EvidenceBegin:
    return EvidenceBegin(envelope_id=envelope, tenant="acme", subject_id="agent:1",
                         tool_name="git", call_id="c1", profile_hash="h",
                         capability="proc.exec:git", inputs_digest=Digest.of(b"x"),
                         produced_at_ms=1000, policy_version_hash="pv")


def end(envelope: str = "e1") -> EvidenceEnd:
    return EvidenceEnd(
        envelope_id=envelope, status="ok", outputs_digest=Digest.of(b""), finished_at_ms=1250,
        sandbox_backend="bwrap", sandbox_latency_ms=250.0, sandbox_success=True,
        side_effects=(SideEffectRec(kind=SideEffect.PROCESS, meta={
            "cmd": "git", "args": ["status"], "cwd": "/workspace", "env_keys": ["HOME"],
            "exit_code": 0, "stdout_truncated": True}),))


class FlakySink:
    """A real sink that refuses records while ``down`` is set (a sink outage)."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = True
        self.got: list[str] = []

    def begin(self, ev: EvidenceBegin) -> None:
        self._take(f"begin:{ev.envelope_id}")

    def end(self, ev: EvidenceEnd) -> None:
        self._take(f"end:{ev.envelope_id}")

    def _take(self, item: str) -> None:
        if self.down:
            raise OSError("disk on fire")
        self.got.append(item)

    def close(self) -> None:
        """Nothing to release."""


def test_jsonl_sink_appends_one_record_per_line(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "ev.jsonl")
    sink.begin(begin())
    sink.end(end())
    sink.close()
    again = JsonlSink(tmp_path / "ev.jsonl")  # reopening appends, never truncates
    again.begin(begin("e2"))
    again.close()
    lines = (tmp_path / "ev.jsonl").read_text().splitlines()
    assert [json.loads(ln)["envelope_id"] for ln in lines] == ["e1", "e1", "e2"]
    # each line is the record plus its chain link (seq across reopenings, prev = hash)
    stored = json.loads(lines[1])
    assert [json.loads(ln)["chain"]["seq"] for ln in lines] == [0, 1, 2]
    assert EvidenceEnd.model_validate(strip_chain(stored)) == end()
    with pytest.raises(RuntimeError, match="closed"):
        again.begin(begin())


def test_jsonl_fsync_policies(tmp_path: Path) -> None:
    always = JsonlSink(tmp_path / "a.jsonl", fsync="always")
    never = JsonlSink(tmp_path / "n.jsonl", fsync="never")
    every = JsonlSink(tmp_path / "i.jsonl", interval_s=0.05)  # the default policy: interval
    assert every.fsync == "interval"
    for sink in (always, never, every):
        for i in range(20):
            sink.begin(begin(f"e{i}"))
    assert always.fsyncs == 20  # one per record, before begin returned
    assert never.fsyncs == 0
    deadline = time.monotonic() + 5
    while every.fsyncs == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 1 <= every.fsyncs <= 5  # the background thread batched them
    before = every.fsyncs
    every.close()
    assert every.fsyncs == before + 1  # close always syncs what is left
    for sink in (always, never):
        sink.close()
    for name in ("a", "n", "i"):
        assert len((tmp_path / f"{name}.jsonl").read_text().splitlines()) == 20
    assert JsonlSink(tmp_path / "b.jsonl", fsync=True).fsync == "always"  # the older bool form
    with pytest.raises(ValueError, match="fsync"):
        JsonlSink(tmp_path / "x.jsonl", fsync="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "error"), [
    ({"fsync": "sometimes"}, "fsync"), ({"fsync_interval_ms": 0}, "fsync_interval_ms"),
    ({"fsync_interval_ms": True}, "fsync_interval_ms"), ({"color": 1}, "unknown option"),
])
def test_jsonl_options_are_validated(tmp_path: Path, options: dict[str, object],
                                     error: str) -> None:
    from plugins.evidence_jsonl import _validated

    config = EngineConfig(state_dir=tmp_path, options={"evidence_jsonl": options})
    with pytest.raises(ValueError, match=error):
        _validated(config)
    ok = EngineConfig(state_dir=tmp_path, options={"evidence_jsonl": {"fsync": "never"}})
    # no signing_key: the default key beside the evidence (issue 32 item 10)
    path, fsync, interval, key, every = _validated(ok)
    assert (fsync, interval, every) == ("never", 0.2, 1000)
    assert key is not None
    assert (path.parent / "evidence-signing.pem").exists()
    keyless = EngineConfig(state_dir=tmp_path / "k", options={"evidence_jsonl": {
        "signing_key": False}})
    assert _validated(keyless).signing_key is None


def test_sqlite_sink_fills_the_exec_record_table(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "ev.sqlite")
    sink.begin(begin())
    sink.end(end())
    sink.close()
    db = sqlite3.connect(tmp_path / "ev.sqlite")
    db.row_factory = sqlite3.Row
    row = dict(db.execute("SELECT * FROM sandbox_execs").fetchone())
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert row == {
        "exec_id": "e1", "project_id": "acme", "task_id": "c1", "conversation_id": "agent:1",
        "skill_id": "git", "image": "bwrap", "cmd": "git", "args": '["status"]',
        "cwd": "/workspace", "env_keys": '["HOME"]',
        "policy_snapshot": '{"profile_hash": "h", "policy_version_hash": "pv", '
                           '"capability": "proc.exec:git"}',
        "status": "ok", "exit_code": 0, "error_reason": None, "started_at": 1000,
        "ended_at": 1250, "duration_ms": 250.0, "artifacts_path": None,
        "stdout_truncated": 1, "stderr_truncated": 0}
    types = [r[0] for r in db.execute("SELECT type FROM evidence_records ORDER BY seq")]
    assert types == ["begin", "end"]


def test_spooling_sink_counts_spools_and_retries_in_order(tmp_path: Path) -> None:
    flaky = FlakySink()
    failures: list[str] = []
    sink = SpoolingSink(flaky, tmp_path / "spool", on_failure=failures.append)
    sink.begin(begin("e1"))
    sink.end(end("e1"))
    assert failures == ["flaky", "flaky"]
    assert sink.pending() == 2
    assert flaky.got == []
    flaky.down = False
    sink.begin(begin("e2"))  # the next write replays the spool first
    assert flaky.got == ["begin:e1", "end:e1", "begin:e2"]
    assert sink.pending() == 0
    flaky.down = True
    sink.end(end("e2"))
    flaky.down = False
    sink.close()  # close retries too
    assert flaky.got[-1] == "end:e2"
    assert sink.pending() == 0


def test_failing_sink_never_blocks_the_call_and_is_counted(tmp_path: Path) -> None:
    flaky = FlakySink()

    class SinkPlugin:
        @hookimpl
        def policy_engine_evidence_sinks(self) -> list[FlakySink]:
            return [flaky]

    orch = orchestrator(tmp_path, ScriptedExecutor(), evidence_sinks=("jsonl", "flaky"),
                        extra_plugins=(SinkPlugin(),))
    out = orch.run(grant(), MANIFEST, TmpAllocOp(size_bytes=1))
    assert out.result.ok
    assert orch.metrics.sample("sandbox_evidence_sink_failures_total", {"sink": "flaky"}) == 2
    spooled = (tmp_path / "spool" / "flaky.jsonl").read_text().splitlines()
    assert [json.loads(s)["type"] for s in spooled] == ["begin", "end"]
    flaky.down = False
    orch.close()
    assert flaky.got == [f"begin:{out.envelope_id}", f"end:{out.envelope_id}"]


def test_redacted_op_digests_payloads_and_drops_env_values() -> None:
    payload = base64.b64encode(b"secret body").decode()
    write = redacted_op(FsWriteOp(path="/w", bytes_b64=payload))
    assert write["bytes_b64"] == Digest.of(b"secret body").model_dump(mode="json")
    proc = redacted_op(ProcExecOp(tool="env", env={"B": "2", "A": "1"}))
    assert proc["env"] == ["A", "B"]
    http = redacted_op(NetHttpOp(url="https://x/?t=1", headers={"Authorization": "Bearer z"}))
    assert http["headers"] == ["Authorization"]
    assert capability_string(NetHttpOp(url="https://x/p?token=1")) == "net.http:GET:https://x/p"
    # same op, same digest; key order does not matter
    assert canonical_json({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    assert inputs_digest(ProcExecOp(tool="env", env={"A": "1"})) == \
        inputs_digest(ProcExecOp(tool="env", env={"A": "other"}))
