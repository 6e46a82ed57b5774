"""Evidence-log summary and the `stats` command, on logs the orchestrator really wrote."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from orchestrator_fixtures import MANIFEST, ScriptedExecutor, ScriptedGuard, grant, orchestrator

from policy_engine.cli.stats import command
from policy_engine.model import FsReadOp, OpKind, TmpAllocOp
from policy_engine.stats import percentile, read_logs, summarize


def write_log(tmp: Path) -> Path:
    ex = ScriptedExecutor("tmp-a", kinds=frozenset({OpKind.TMP_ALLOC}))
    guard = ScriptedGuard({"fs.read": "SANDBOX.CAPABILITY_BLOCKED"})
    with orchestrator(tmp, ex, guard=guard) as orch:
        for i in range(3):
            orch.run(grant(f"ok{i}"), MANIFEST, TmpAllocOp(size_bytes=1))
        orch.run(grant("denied"), MANIFEST, FsReadOp(path="/etc/shadow"))
    return tmp / "evidence" / "evidence.jsonl"


def test_summary_by_backend_rates_denials_and_latency(tmp_path: Path) -> None:
    log = write_log(tmp_path)
    summary = summarize(read_logs([log]).records)
    assert summary["calls"] == 4
    assert summary["statuses"] == {"denied": 1, "ok": 3}
    assert summary["by_backend"]["tmp-a"]["count"] == 3
    assert summary["by_backend"]["tmp-a"]["success_rate"] == 1.0
    assert summary["by_backend"]["(none)"]["count"] == 1
    assert summary["denial_codes"] == {"SANDBOX.CAPABILITY_BLOCKED": 1}
    assert summary["timeout_rate"] == 0.0
    assert summary["degrade_rate"] == 0.0
    assert summary["latency_ms"]["p50"] is not None


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (50, 90, 99)] == [50.0, 90.0, 99.0]
    assert percentile([], 50) is None


def test_torn_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    log = write_log(tmp_path)
    with log.open("a") as fh:
        fh.write('{"type": "end", "envelope_')
    read = read_logs([log])
    assert read.unreadable == 1
    assert summarize(read.records)["calls"] == 4


def test_stats_command_text_json_and_missing_file(tmp_path: Path) -> None:
    log = write_log(tmp_path)
    runner = CliRunner()
    text = runner.invoke(command, [str(log)])
    assert text.exit_code == 0
    assert "calls: 4  denied: 1  ok: 3" in text.output
    assert "SANDBOX.CAPABILITY_BLOCKED" in text.output
    as_json = runner.invoke(command, [str(log), "--format", "json"])
    assert json.loads(as_json.output)["by_backend"]["tmp-a"]["ok"] == 3
    missing = runner.invoke(command, [str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2
    assert "cannot read" in missing.output
