"""Attack 36 through the CLI: `run` refuses an op on its own state directory (the evidence key
it has just made) under a policy permitting the whole project, and `explain` — on the state
dir `run` would use: `--state-dir`, else `$POLICY_ENGINE_STATE`, else `./var` — gives the same
refusal (dry run equals run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def _cli(cwd: Path, *args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    if state is not None:
        env["POLICY_ENGINE_STATE"] = str(state)
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def _project(tmp_path: Path) -> tuple[Path, Path]:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hello.txt").write_text("hi\n")
    (tmp_path / "p.sbpolicy").write_text(
        f'policy "cli/project" version "1.0.0"\n'
        f'permit "project" fs.read, fs.list paths ["{proj}/**"]\n')
    perms = [{"kind": "fs.read", "paths": [f"{proj}/**"]}]
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "reader", "version": "1.0.0", "side_effects": ["Read"], "permissions": perms}))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "a", "tool_name": "reader", "call_id": "c",
        "expires_at": 4102444800000, "capabilities": perms}))
    return proj, tmp_path / "p.sbpolicy"


def _request(tmp_path: Path, proj: Path, path: Path) -> Path:
    req = tmp_path / f"r-{path.name}.json"
    req.write_text(json.dumps({"op": {"kind": "fs.read", "path": str(path)},
                               "settings": {"root_fs": str(proj)},
                               "manifest": str(tmp_path / "m.json"),
                               "grant": str(tmp_path / "g.json")}))
    return req


@pytest.mark.parametrize("how", ["default ./var", "--state-dir", "$POLICY_ENGINE_STATE"])
def test_run_and_explain_refuse_the_state_dir_alike(tmp_path: Path, how: str) -> None:
    proj, policy = _project(tmp_path)
    state = proj / ("var" if how == "default ./var" else "engine-state")
    flag = ("--state-dir", str(state)) if how == "--state-dir" else ()
    env_state = state if how == "$POLICY_ENGINE_STATE" else None
    base = ("--format", "json", "--policy", str(policy))
    # the open permit works, and the run creates the state dir with its evidence key
    hello = _cli(proj, "run", *base, "--request", str(_request(tmp_path, proj,
                                                                proj / "hello.txt")),
                 *flag, state=env_state)
    assert hello.returncode == 0, hello.stdout + hello.stderr
    key = state / "keys" / "evidence-hmac.key"
    assert key.is_file()
    req = str(_request(tmp_path, proj, key))
    ran = _cli(proj, "run", *base, "--request", req, *flag, state=env_state)
    said = _cli(proj, "explain", *base, "--request", req, *flag, state=env_state)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert said.returncode == 0, said.stdout + said.stderr
    out, dry = json.loads(ran.stdout), json.loads(said.stdout)
    assert "bytes_b64" not in json.dumps(out["result"])
    assert out["result"]["code"] == dry["code"] == "SANDBOX.CAPABILITY_BLOCKED", (out, dry)
    assert out["decision"]["rule"]["id"] == dry["rule"]["id"] == "builtin:engine-state"
    assert out["decision"]["reason"] == dry["reason"]


def test_explain_with_a_config_refuses_the_config_state_dir(tmp_path: Path) -> None:
    proj, policy = _project(tmp_path)
    state = proj / "configured"
    (state / "keys").mkdir(parents=True)
    (state / "keys" / "evidence-hmac.key").write_bytes(os.urandom(32))
    config = tmp_path / "engine.yaml"
    config.write_text(f"state_dir: {state}\nmode: compat\n")
    req = str(_request(tmp_path, proj, state / "keys" / "evidence-hmac.key"))
    said = _cli(proj, "explain", "--format", "json", "--policy", str(policy), "--request", req,
                "--config", str(config))
    assert said.returncode == 0, said.stdout + said.stderr
    dry = json.loads(said.stdout)
    assert dry["code"] == "SANDBOX.CAPABILITY_BLOCKED", dry
    assert dry["rule"]["id"] == "builtin:engine-state", dry
    # the same request, the state dir elsewhere: the policy allows it
    other = _cli(proj, "explain", "--format", "json", "--policy", str(policy), "--request", req,
                 "--state-dir", str(tmp_path / "elsewhere"))
    assert json.loads(other.stdout)["decision"] == "allow", other.stdout
