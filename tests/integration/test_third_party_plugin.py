"""A real third-party plugin package is pip-installed, discovered by entry point and used.

The fixture package (tests/fixtures/thirdparty_plugin) declares three entry points: a good
plugin (a `demo-tmp` executor and a `demo` evidence sink), one that fails to import and one with
a misspelt hook. Discovery and use are checked in fresh interpreters, as a user would see them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.pip_packages import installed_packages

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parents[1] / "fixtures" / "thirdparty_plugin"
DIST = "pe-thirdparty-demo"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with installed_packages({DIST: FIXTURE}, tmp_path_factory.mktemp("build")):
        yield


def python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_plugin_is_listed_with_source_and_capabilities_and_broken_ones_by_name(
        installed: None) -> None:
    proc = python("from policy_engine.cli.plugins import command; command()",
                  "--format", "json")
    assert proc.returncode == 1, proc.stderr   # two of the package's plugins failed to load
    info = json.loads(proc.stdout)
    by_name = {p["name"]: p for p in info["plugins"]}
    good = by_name["demo_good"]
    assert (good["distribution"], good["version"]) == (DIST, "0.3.1")
    assert good["module"] == "pe_thirdparty_demo.good"
    assert good["file"].endswith("pe_thirdparty_demo/good.py")
    assert good["executors"] == [{"name": "demo-tmp", "capabilities": {
        "op_kinds": ["tmp.alloc"], "network_modes": ["off"], "bind_mounts": False,
        "readonly_rootfs": False, "resource_limits": True, "env_filtering": False,
        "streaming_output": False, "mandatory_denies": False, "isolation": []}}]
    assert good["sinks"] == ["demo"]
    errors = {e["plugin"]: e for e in info["load_errors"]}
    assert errors["demo_broken"]["stage"] == "import"
    assert "pe_thirdparty_demo_missing_dependency" in errors["demo_broken"]["message"]
    assert errors["demo_misnamed"]["stage"] == "validate"
    assert "unknown hook 'policy_engine_executor'" in errors["demo_misnamed"]["message"]
    # the rest still loaded: first-party plugins come through the same entry points
    assert by_name["evidence_jsonl"]["distribution"] == "policy-engine"
    assert by_name["budget_sqlite"]["meters"] == ["sqlite"]
    assert "demo_broken" not in by_name
    assert "demo_misnamed" not in by_name
    # each failure is reported once: in the listing, not logged beside it
    assert proc.stdout.count("pe_thirdparty_demo_missing_dependency") == 1
    assert "demo_broken" not in proc.stderr
    text = python("from policy_engine.cli.plugins import command; command()")
    assert text.returncode == 1
    assert text.stderr.count("plugin `demo_broken` failed to import") == 1


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_plugin_executor_and_sink_are_selected_by_config_and_used(
        installed: None, tmp_path: Path) -> None:
    policy = write(tmp_path / "p.sbpolicy",
                   'policy "demo/thirdparty" version "1.0.0"\n\npermit tmp.use max_bytes 64MiB\n')
    manifest = write(tmp_path / "m.json", {"name": "scratch", "version": "1.0", "permissions": [
        {"kind": "tmp.use", "max_bytes": 4096}]})
    grant = write(tmp_path / "g.json", {
        "tenant": "acme", "subject_id": "agent:1", "tool_name": "scratch", "call_id": "c1",
        "expires_at": 4_000_000_000_000, "capabilities": [{"kind": "tmp.use"}]})
    request = write(tmp_path / "r.json", {"op": {"kind": "tmp.alloc", "size_bytes": 100},
                                          "now_ms": 1_700_000_000_000})
    config = write(tmp_path / "engine.yaml", "backends:\n  tmp.alloc: demo-tmp\n"
                   "evidence_sinks: [jsonl, demo]\nbudget_meter: sqlite\n")
    state = tmp_path / "state"
    proc = python("from policy_engine.cli.run import command; command()",
                  "--policy", str(policy), "--manifest", str(manifest), "--grant", str(grant),
                  "--request", str(request), "--config", str(config), "--state-dir", str(state),
                  "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["result"]["ok"] is True
    assert out["result"]["out"]["by"] == "pe-thirdparty-demo"
    assert out["evidence"]["sandbox_backend"] == "demo-tmp"
    log = (state / "evidence" / "evidence.jsonl").read_text()
    jsonl = [json.loads(x) for x in log.splitlines()]
    # and a checkpoint signed at shutdown by default (issue 32 item 10)
    assert [r["type"] for r in jsonl] == ["begin", "end", "checkpoint"]
    demo = [json.loads(x) for x in (state / "demo-sink.jsonl").read_text().splitlines()]
    assert demo == [{"type": "begin", "envelope_id": out["envelope_id"]},
                    {"type": "end", "envelope_id": out["envelope_id"], "status": "ok"}]
