"""docs/ci.md's GitHub workflow, run as written against a repository whose policy is not called
`org.sbpolicy`: each step's `run:` script, copied from the workflow file, in bash as Actions runs
it (`bash -e`), with `policy-engine` being this checkout's.

The decision-diff step is not run here: it is being made independent of the policy's name on
another branch, whose tests cover it (run_steps() names the steps run, so adding it is one line).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "ci" / "github-workflow.yml"
STEPS = ("Lint", "Format check", "Policy unit tests")


def _scripts() -> dict[str, str]:
    steps = next(iter(yaml.safe_load(WORKFLOW.read_text())["jobs"].values()))["steps"]
    return {s["name"]: s["run"] for s in steps if "name" in s and "run" in s}


def _repo(tmp_path: Path) -> Path:
    """The layout the workflow expects, with the example policy renamed `payments`."""
    repo = tmp_path / "repo"
    (repo / "policies").mkdir(parents=True)
    for name in ("network.sbpolicy", "secrets.sbpolicy"):
        shutil.copy(ROOT / "examples" / "policies" / name, repo / "policies" / name)
    shutil.copy(ROOT / "examples" / "policies" / "org.sbpolicy",
                repo / "policies" / "payments.sbpolicy")
    tests = (ROOT / "examples" / "policies" / "org.sbtest.yaml").read_text()
    assert "policy: org.sbpolicy\n" in tests
    (repo / "policies" / "payments.sbtest.yaml").write_text(
        tests.replace("policy: org.sbpolicy\n", "policy: payments.sbpolicy\n"))
    shutil.copytree(ROOT / "examples" / "manifests", repo / "manifests")
    shutil.copytree(ROOT / "examples" / "grants", repo / "grants")  # the tests' fixtures
    return repo


def _shim(tmp_path: Path) -> Path:
    """A `policy-engine` on PATH that runs this checkout's engine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "policy-engine"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m policy_engine.cli "
                    '"$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_the_workflow_steps_run_as_written_on_a_policy_named_otherwise(tmp_path: Path) -> None:
    repo, bin_dir = _repo(tmp_path), _shim(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    scripts = _scripts()
    results = {}
    for name in STEPS:
        done = subprocess.run(["bash", "-e", "-c", scripts[name]], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=300)
        assert "Traceback" not in done.stderr, done.stderr
        results[name] = done.returncode
        assert done.returncode == 0, (name, done.stdout[-2000:], done.stderr[-2000:])
    assert results == dict.fromkeys(STEPS, 0)
    sarif = json.loads((repo / "lint.sarif").read_text())
    results_ = sarif["runs"][0]["results"]
    # the example manifests' findings are suppressed with their reasons, still in the report
    assert results_
    assert all(r.get("suppressions") for r in results_), results_
    junit = (repo / "junit.xml").read_text()
    assert "payments.sbtest.yaml" in junit
    assert 'failures="0"' in junit
