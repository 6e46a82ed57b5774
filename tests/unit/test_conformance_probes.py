"""The kit's probe policy generation and report rendering, without plugins or subprocesses."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.conformance.harness import probe_manifest
from policy_engine.conformance.probes import ProbeEnv, default_probes, policy_text
from policy_engine.conformance.report import CheckResult, Report
from policy_engine.conformance.server import ProbeServer
from policy_engine.guard import Guard
from policy_engine.model import Grant, OpKind, Settings
from policy_engine.profile import ProfileBuilder


@pytest.mark.parametrize("kind", [k for k in OpKind if k != OpKind.BROWSER_SCREENSHOT])
def test_default_probes_compile_and_the_guard_allows_them(kind: OpKind, tmp_path: Path) -> None:
    with ProbeServer("s3cret") as server:
        env = ProbeEnv(workdir=tmp_path, root=tmp_path / "root", tmp_dir=tmp_path / "tmp",
                       server=server, secret="s3cret")
        probes = default_probes(kind, env)
        assert probes, kind
        policy = tmp_path / "p.sbpolicy"
        policy.write_text(policy_text(probes))
        ps = compile_files([policy])
        for probe in probes:
            caps = probe.caps()
            grant = Grant(tenant="t", subject_id="s", tool_name="conformance-probe", call_id="c",
                          capabilities=caps, expires_at=4_000_000_000_000)
            manifest = probe_manifest(probe)
            profile = ProfileBuilder(ps).build(grant, manifest, settings=Settings(
                root_fs=str(env.root), tmp_dir=str(env.tmp_dir)))
            decision = Guard(ps).decide(profile, probe.exec_op())
            assert decision.allowed, (probe.label(), decision.reason)
            denied = ProfileBuilder(ps).build(grant.model_copy(update={"capabilities": ()}),
                                              manifest)
            assert not Guard(ps).decide(denied, probe.exec_op()).allowed


def test_report_renders_text_json_and_junit() -> None:
    report = Report("demo", {"op_kinds": ["tmp.alloc"]}, [
        CheckResult("metadata.name", "name ok", "pass"),
        CheckResult("timeout.honoured", "timeouts", "fail", ("kept running 3.0 s",)),
        CheckResult("cancel.honoured", "cancel", "n/a", note="no slow probe"),
    ])
    assert not report.ok
    text = report.to_text()
    assert "FAIL timeout.honoured: timeouts\n     - kept running 3.0 s" in text
    assert "1 passed, 1 failed, 1 not applicable" in text
    data = json.loads(json.dumps(report.to_json()))
    assert data["counts"] == {"pass": 1, "fail": 1, "n/a": 1}
    suite = ET.fromstring(report.to_junit())
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    failure = suite.find("testcase[@name='timeout.honoured']/failure")
    assert failure is not None
    assert failure.get("message") == "kept running 3.0 s"


def test_a_problem_line_carries_the_exception_message() -> None:
    """Issue 30: the kit printed "ended with raised ValueError" and nothing an author could
    act on; the message now follows the type (and an empty one says so)."""
    from policy_engine.conformance import checks

    res = checks.check_limits_timeout(("raised", ValueError("deadline is not a float")), 0.1,
                                      1.0, 1.0, "run /bin/sleep 30")
    assert res.status == "fail"
    assert "ended with raised ValueError: deadline is not a float;" in res.message
    assert checks.exception_text(KeyError()) == "KeyError: (no message)"
