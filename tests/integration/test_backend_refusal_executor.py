"""Outsider round 5 F06: a refusal the chosen executor makes from the profile and op alone is part
of the dry run. `explain --config` answered ALLOW while `run --config` refused the same call with
SANDBOX.CAPABILITY_BLOCKED and still reported `decision: allow`, for

- a proc.exec whose effective network mode is `restricted` (manifest `network: restricted`, or
  `on` beside the policy's net.http rules) on proc-landlock, proc-unshare or local: they "cannot
  restrict the network to the policy proxy";
- the docker backend with a cwd outside /workspace/work (since sessions: a cwd outside
  /workspace is a bound call, bubblewrap's binds at their own paths, and one that does not exist
  there is what docker refuses).

Run through the CLI on the real backends; nothing starts (the refusal comes before any sandbox).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_backend_refusal_decision import _cli, assert_run_denies_as_explain_said

pytestmark = pytest.mark.integration

POLICY = """policy "f06/netrestricted" version "1.0.0"
permit "py" proc.exec tool "python3"
permit "rd" fs.read paths ["{ws}/**"]
permit "net" net.http hosts ["example.com"] methods ["GET"]
require consent when `false`
"""


def _files(tmp_path: Path, backend: str, mode: str, network: str | None,
           cwd: str | None) -> list[str]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (tmp_path / "p.sbpolicy").write_text(POLICY.format(ws=ws))
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "fs.read", "paths": [f"{ws}/**"]},
             {"kind": "net.http", "hosts": ["example.com"], "methods": ["GET"]}]
    manifest: dict[str, object] = {
        "name": "pyrun", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Process"], "safety_class": "Low"}
    if network is not None:
        manifest["network"] = network
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:x", "tool_name": "pyrun", "call_id": "c1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 100}}))
    op: dict[str, object] = {"kind": "proc.exec", "tool": "python3", "args": ["-c", "1"]}
    request: dict[str, object] = {"op": op}
    if cwd is not None:  # beneath root_fs (the guard's check), the executor's is its own
        op["cwd"] = cwd.format(ws=ws)
        request["settings"] = {"root_fs": str(tmp_path)}
    (tmp_path / "req.json").write_text(json.dumps(request))
    config = tmp_path / f"{backend}-{mode}.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nmode: {mode}\n"
                      f"backends: {{proc.exec: {backend}}}\n")
    return ["--config", str(config), "--policy", str(tmp_path / "p.sbpolicy"),
            "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
            "--request", str(tmp_path / "req.json")]




REFUSED = [
    ("proc-landlock", "compat", "restricted", None, "cannot restrict the network"),
    ("proc-unshare", "compat", "restricted", None, "cannot restrict the network"),
    # `on` beside net.http rules becomes `restricted`
    ("proc-unshare", "compat", "on", None, "cannot restrict the network"),
    ("local", "compat", "on", None, "cannot restrict the network"),
    ("docker", "compat", None, "{ws}/gone", "does not exist (docker view)"),
]


@pytest.mark.parametrize(("backend", "mode", "network", "cwd", "why"), REFUSED)
def test_explain_denies_what_the_executor_refuses_and_the_run_says_deny(
        tmp_path: Path, backend: str, mode: str, network: str | None, cwd: str | None,
        why: str) -> None:
    args = _files(tmp_path, backend, mode, network, cwd)
    dry = _cli("explain", *args, "--format", "json")
    assert dry.returncode == 0, dry.stdout + dry.stderr  # a decision was made
    said = json.loads(dry.stdout)
    assert said["decision"] == "deny", said
    assert said["code"] == "SANDBOX.CAPABILITY_BLOCKED", said
    assert why in said["reason"], said
    assert said["trace"][-1]["node"] == "backend", said["trace"]
    assert said["trace"][-1]["outcome"] == "fail"

    assert_run_denies_as_explain_said(_cli("run", *args, "--format", "json"), said)


ALLOWED = [
    ("proc-bwrap", "compat", "restricted", None),  # bwrap bridges to the policy proxy
    ("proc-landlock", "compat", "off", None),
    ("docker", "strict", None, None),
    ("docker", "compat", None, "{ws}"),  # a bound call (a session's shape)
]


@pytest.mark.parametrize(("backend", "mode", "network", "cwd"), ALLOWED)
def test_explain_still_allows_what_the_executor_takes(tmp_path: Path, backend: str, mode: str,
                                                      network: str | None,
                                                      cwd: str | None) -> None:
    dry = _cli("explain", *_files(tmp_path, backend, mode, network, cwd), "--format", "json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    said = json.loads(dry.stdout)
    assert said["decision"] == "allow", said
    step = said["trace"][-1]
    assert (step["node"], step["outcome"]) == ("backend", "pass"), said["trace"]
    assert f"backend `{backend}`" in step["detail"]
