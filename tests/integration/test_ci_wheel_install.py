"""The CI workflow's install route for real: build policy-engine's wheel, pip-install it into a
fresh virtualenv (the way the workflow's `pip install "$POLICY_ENGINE"` does with a wheel), and
run the workflow's `policy-engine` lines with that installation's console script.

Dependencies come from this machine's site-packages (`--system-site-packages`, `--no-deps`):
what is checked is the wheel itself (package data such as the grammar, the entry points, the
public-suffix list it depends on), without the network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from tests.integration.project_wheel import project_wheel

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "ci" / "github-workflow.yml"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    wheel = project_wheel(tmp_path_factory)
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(work / "venv")
    python = work / "venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", str(wheel)], check=True, timeout=600)
    return work / "venv" / "bin" / "policy-engine"


def _commands() -> list[list[str]]:
    steps = next(iter(yaml.safe_load(WORKFLOW.read_text())["jobs"].values()))["steps"]
    lines = [line.strip() for s in steps for line in str(s.get("run", "")).splitlines()]
    return [line.split()[1:] for line in lines
            if line.startswith("policy-engine ") and "diff" not in line.split()[:2]]


def test_the_workflow_runs_with_an_engine_installed_from_its_wheel(
        installed: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "examples" / "manifests", repo / "manifests")
    shutil.copytree(ROOT / "examples" / "policies", repo / "policies")
    shutil.copytree(ROOT / "examples" / "grants", repo / "grants")   # the tests' fixtures
    (repo / ".git").mkdir()
    # only the wheel's installation: no checkout on the path, as on a CI runner
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["POLICY_ENGINE_DOCS_URL"] = "https://docs.example.com/policy-engine/docs/"
    where = subprocess.run([str(installed.parent / "python"), "-c",
                            "import policy_engine; print(policy_engine.__file__)"],
                           capture_output=True, text=True, env=env, cwd=repo, check=True)
    assert "/venv/lib/" in where.stdout
    codes = {}
    for argv in _commands():
        proc = subprocess.run([str(installed), *argv], capture_output=True, text=True,
                              env=env, cwd=repo, timeout=300)
        assert "Traceback" not in proc.stderr
        codes[argv[0]] = proc.returncode
    # lint: the example manifests' findings reach the SARIF, suppressed with their reasons
    # (examples/manifests/.sbpolicy-ignore.yaml, which the wheel's lint reads too); all pass
    assert codes == {"lint": 0, "fmt": 0, "test": 0}
    sarif = json.loads((repo / "lint.sarif").read_text())
    run = sarif["runs"][0]
    assert {r["ruleId"] for r in run["results"]} >= {"SBP302", "SBP312"}
    assert all(r.get("suppressions") for r in run["results"])
    links = {r["id"]: r.get("helpUri") for r in run["tool"]["driver"]["rules"]}
    assert links["SBP302"] == "https://docs.example.com/policy-engine/docs/lint-rules.md#sbp302"
