"""The executor conformance kit, as a plugin author runs it: real pip installs of the sample
packages, `policy-engine conformance` and `pytest --pe-executor` as subprocesses.

The good sample (examples/thirdparty-executor) must pass; the broken one must fail exactly the
checks its faults break, with messages naming the fault; first-party executors must pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integration.pip_packages import installed_packages
from tests.integration.pytest_child import WITHOUT_UNUSED

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
SAMPLES = {"pe-sample-executor": ROOT / "examples" / "thirdparty-executor",
           "pe-sample-executor-broken": ROOT / "examples" / "thirdparty-executor-broken"}
CLI = [sys.executable, "-c", "from policy_engine.cli.main import main; main()"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with installed_packages(SAMPLES, tmp_path_factory.mktemp("build")):
        yield


def conformance(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "conformance", *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd)


def checks_of(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    report = json.loads(proc.stdout)
    return {c["id"]: c for c in report["checks"]}


def test_sample_executor_passes_every_check(installed: None, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    proc = conformance("--executor", "sample-http", "--format", "json", "--junit", str(junit),
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = checks_of(proc)
    not_passing = {k: (c["status"], c["note"]) for k, c in checks.items()
                   if c["status"] != "pass"}
    # the sandbox claims are about proc.exec, which an HTTP executor does not serve, and the
    # compat check needs --mode compat
    compat = not_passing.pop("compat.degraded-recorded")
    assert compat[0] == "n/a"
    assert compat[1].startswith("strict mode:")
    assert not_passing
    assert all(
        k.startswith("claims.") and v == ("n/a", "the executor does not serve proc.exec")
        for k, v in not_passing.items()), json.dumps(not_passing)
    # the timeout and cancellation checks really ran (the sample has slow probes)
    assert {"timeout.honoured", "cancel.honoured", "limits.timeout", "capabilities.runs[net.http]",
            "evidence.no-secrets", "refusal.wrong-kind"} <= set(checks)
    assert 'failures="0"' in junit.read_text()
    assert "Traceback" not in proc.stderr


# check id → a phrase its failure message must contain (one per deliberate fault)
BROKEN = {
    "capabilities.runs[fs.read]": "raised NotImplementedError: fs.read is not implemented yet",
    "refusal.registry-codes": "raise PolicyEngineError with a registry code",
    "refusal.wrong-kind": "accepted a `browser.nav` op it does not declare and returned ok",
    "evidence.no-secrets": "$.side_effects[0].meta.request_headers.Authorization",
    "timeout.honoured": "execute() was still running",
    "cancel.honoured": "it ignores ctx.deadline / ctx.cancel",
    "limits.timeout": "it follows profile.limits / profile.timeout_ms",
}


def test_broken_executor_fails_the_checks_its_faults_break(installed: None,
                                                           tmp_path: Path) -> None:
    # the JSON and the text report come from two runs of the kit; each spends most of its
    # ~10 s waiting out the broken executor's ignored deadlines, so they run side by side
    with ThreadPoolExecutor(2) as pool:
        as_json = pool.submit(conformance, "--executor", "sample-http-broken", "--format",
                              "json", cwd=tmp_path)
        as_text = pool.submit(conformance, "--executor", "sample-http-broken", cwd=tmp_path)
        proc, text = as_json.result(), as_text.result()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = checks_of(proc)
    failed = {cid for cid, c in checks.items() if c["status"] == "fail"}
    assert failed == set(BROKEN)
    for cid, phrase in BROKEN.items():
        assert any(phrase in p for p in checks[cid]["problems"]), (cid, checks[cid])
    # what it does right still passes: the kit does not fail everything wholesale
    assert checks["capabilities.runs[net.http]"]["status"] == "pass"
    assert checks["evidence.complete"]["status"] == "pass"
    assert text.returncode == 1
    assert "FAIL timeout.honoured" in text.stdout
    assert "7 failed" in text.stdout
    assert "Traceback" not in text.stderr


def test_unknown_executor_exits_2_listing_installed_ones(installed: None,
                                                         tmp_path: Path) -> None:
    proc = conformance("--executor", "no-such-executor", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no installed plugin provides an executor named `no-such-executor`" in proc.stderr
    listed = next(line for line in proc.stderr.splitlines()
                  if line.startswith("installed executors:"))
    assert "sample-http" in listed
    assert "fs" in listed
    assert "Traceback" not in proc.stderr


def run_pytest(name: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           *WITHOUT_UNUSED, "-rA", "--pe-executor", name, "--rootdir", str(cwd)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_pytest_plugin_items_pass_for_the_sample(installed: None, tmp_path: Path) -> None:
    proc = run_pytest("sample-http", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "13 passed" in proc.stdout
    assert "PASSED ::conformance[sample-http]::timeout.honoured" in proc.stdout


def test_pytest_plugin_items_fail_for_the_broken_one(installed: None, tmp_path: Path) -> None:
    proc = run_pytest("sample-http-broken", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "7 failed, 7 passed" in proc.stdout
    for cid, phrase in BROKEN.items():
        assert f"FAILED ::conformance[sample-http-broken]::{cid}" in proc.stdout
        assert phrase in proc.stdout
    assert "Traceback" not in proc.stdout


def test_pytest_plugin_is_inert_without_the_option(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           *WITHOUT_UNUSED, "--rootdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert "1 passed" in proc.stdout
    assert "conformance[" not in proc.stdout


@pytest.mark.parametrize("name", ["fs", "tmp", "proc-bwrap", "http"])
def test_first_party_executors_pass(name: str, tmp_path: Path) -> None:
    proc = conformance("--executor", name, "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = checks_of(proc)
    assert [c for c in checks.values() if c["status"] == "fail"] == []
    assert checks[f"capabilities.runs[{ {'fs': 'fs.read', 'tmp': 'tmp.alloc', 'proc-bwrap': 'proc.exec', 'http': 'net.http'}[name]}]"]["status"] == "pass"  # noqa: E501
    if name in ("proc-bwrap", "http"):  # the kinds with a slow default probe
        assert checks["timeout.honoured"]["status"] == "pass"
        assert checks["cancel.honoured"]["status"] == "pass"
