"""docs/operations.md "What a sandboxed process finds", for real in bubblewrap: the sandbox's
PATH finds the system `python3`, which has no pytest; a virtualenv the project ships inside its
workspace, made from that same system interpreter, runs the project's tests.

The venv gets pytest by copying the host's pure-Python packages into it (the test uses no
network); a real project would `pip install` into it once, outside the sandbox.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")


def _project(root: Path) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_math.py").write_text("def test_add():\n    assert 1 + 1 == 2\n")
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(root / ".venv")],
                   check=True, timeout=120)
    site = next((root / ".venv" / "lib").glob("python3*/site-packages"))
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = Path(str(spec.origin if spec is not None else ""))
        assert origin.is_file(), name
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, site / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:  # a one-file module (pytest's `py` shim)
            shutil.copy(origin, site / origin.name)
    return root / ".venv" / "bin" / "python"


def _run(work: Path, root: Path, tool: str, args: list[str]) -> dict[str, object]:
    """`policy-engine run` of ``tool args`` in ``root`` under a policy permitting exactly it."""
    work.mkdir()
    policy = work / "pytest.sbpolicy"
    policy.write_text(
        'policy "proj/pytest" version "1.0.0"\n'
        f'permit "read-project" fs.read, fs.list  paths ["{root}/**"]\n'
        f'permit "pytest" proc.exec  tool "{tool}"  args ["-m", "pytest", '
        r'/[A-Za-z0-9_.\/:=-]+/ ...]' "\n")
    slots = [{"alternatives": [{"literal": "-m"}]}, {"alternatives": [{"literal": "pytest"}]},
             {"alternatives": [{"regex": "[A-Za-z0-9_./:=-]+"}], "repeat": True}]
    (work / "tool.json").write_text(json.dumps({
        "name": "pytest", "version": "1.0.0", "side_effects": ["Process", "Read"],
        "permissions": [{"kind": "proc.exec", "tool": tool, "args": slots},
                        {"kind": "fs.read", "paths": [f"{root}/**"]}]}))
    (work / "grant.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:ci", "tool_name": "pytest", "call_id": "c-1",
        "expires_at": 4102444800000,
        "capabilities": [{"kind": "proc.exec", "tool": tool},
                         {"kind": "fs.read", "paths": [f"{root}/**"]}],
        "consent": {"granted_by": "user:dana", "granted_at": 1790000000000,
                    "expires_at": 4102444800000}}))
    (work / "request.json").write_text(json.dumps({
        "op": {"kind": "proc.exec", "tool": tool, "args": args, "cwd": str(root)},
        "manifest": "tool.json", "grant": "grant.json",
        "settings": {"root_fs": str(root)}}))
    # bubblewrap: bind mounts show only /usr, /bin, /lib, /etc and the profile's paths
    (work / "config.yaml").write_text("backends: {proc.exec: proc-bwrap}\n")
    done = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--format", "json",
         "--policy", str(policy), "--request", str(work / "request.json"),
         "--state-dir", str(work / "state"), "--config", str(work / "config.yaml")],
        capture_output=True, text=True, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_the_system_python_has_no_pytest_and_a_workspace_venv_runs_it(tmp_path: Path) -> None:
    root = tmp_path / "project"
    venv_python = _project(root)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]

    bare = _run(tmp_path / "bare", root, "python3", args)  # PATH's python3: /usr/bin/python3
    decision = bare["decision"]
    assert isinstance(decision, dict)
    assert decision["decision"] == "allow", bare
    result = bare["result"]
    assert isinstance(result, dict)
    assert result["out"]["exit_code"] == 1, result  # ran, and found no pytest
    assert "No module named pytest" in result["out"]["stderr"]

    ran = _run(tmp_path / "venv", root, str(venv_python), args)
    result = ran["result"]
    assert isinstance(result, dict)
    assert result["ok"] is True, ran
    out = result["out"]
    assert isinstance(out, dict)
    assert out["exit_code"] == 0, (out["stdout"], out["stderr"])
    assert out["backend"] == "proc-bwrap"
    assert "1 passed" in str(out["stdout"])
