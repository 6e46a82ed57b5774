"""Dry run equals run on every backend for the facts of the executor's own view (issue 26 item
4, issue 32 item 5 / second pass N6): a cwd inside the container, the state directory under
``root_fs``, and a workspace (``root_fs``) that does not exist on the host.

Each case runs ``explain --config`` and then ``run --config`` through the CLI on the real
backend (bubblewrap, Landlock, unshare, the local runner, Docker): when explain allows, the
run's tool ran; when explain denies, the run denies with the same code and reason. Before the
fix the guard judged every cwd on this host's disk (a Docker call with cwd
``/workspace/work`` was refused on a host without ``/workspace``) and Docker's refusal of a
workspace beneath ``root_fs`` came only from ``execute`` (explain allowed it).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.integration.test_backend_refusal_decision import _cli, assert_run_denies_as_explain_said

pytestmark = pytest.mark.integration

BACKENDS = ["proc-bwrap", "proc-landlock", "proc-unshare", "local", "docker"]
PRINT = "import os; print('RAN', os.getcwd())"


def _files(tmp_path: Path, backend: str, case: str) -> tuple[list[str], str]:
    """The CLI arguments of one case, and the cwd the tool should print when it runs."""
    ws = tmp_path / "ws"
    (ws / "work").mkdir(parents=True, exist_ok=True)
    state = tmp_path / "state"
    root_fs = str(ws)
    cwd: str | None = f"{ws}/work"
    docker = backend == "docker"
    if docker:
        cwd = "/workspace/work"  # the container's view; this host has no such directory
        root_fs = "/workspace"
    if case.startswith("session"):
        # a session's shape (docs/sessions.md): root_fs a host directory, cwd in it; docker
        # binds the root at its own path, so every backend sees the same path
        root_fs, cwd = str(ws), f"{ws}/work" if case == "session" else f"{ws}/gone"
        if case == "session-over-state":  # the docker projects of every tenant lie in there
            state = ws / "state"
            cwd = f"{ws}/work"
    elif case == "absent-workspace":
        # a root_fs this host does not have: proc backends see nothing there, Docker its own
        root_fs = f"/pe-absent-{secrets.token_hex(6)}"
        cwd = "/workspace/work" if docker else f"{root_fs}/work"
        if docker:
            root_fs = "/workspace"
    elif case == "state-under-root":
        state = Path(root_fs if not docker else ws) / "var"
        if docker:  # the state dir beneath the profile's root_fs (the run refused it: N6)
            root_fs = str(ws)
            cwd = "/workspace/work"
    policy = f"""policy "facts/{case}" version "1.0.0"
defaults {{ timeout 30s  network off }}
permit "py" proc.exec tool "python3"
permit "rd" fs.read paths ["{root_fs}/**"]
require consent when `false`
"""
    (tmp_path / "p.sbpolicy").write_text(policy)
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "fs.read", "paths": [f"{root_fs}/**"]}]
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "pyrun", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Process"], "safety_class": "Low"}))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:x", "tool_name": "pyrun", "call_id": "c1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 100}}))
    op: dict[str, object] = {"kind": "proc.exec", "tool": "python3", "args": ["-c", PRINT]}
    if cwd is not None:
        op["cwd"] = cwd
    (tmp_path / "req.json").write_text(json.dumps({"op": op,
                                                   "settings": {"root_fs": root_fs}}))
    config = tmp_path / "engine.yaml"
    config.write_text(f"state_dir: {state}\nmode: compat\nbackends: {{proc.exec: {backend}}}\n")
    return (["--config", str(config), "--policy", str(tmp_path / "p.sbpolicy"),
             "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
             "--request", str(tmp_path / "req.json")], cwd or "")


def _agree(args: list[str], cwd: str) -> dict[str, object]:
    dry = _cli("explain", *args, "--format", "json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    said: dict[str, object] = json.loads(dry.stdout)
    ran = _cli("run", *args, "--format", "json")
    if said["decision"] == "deny":
        assert_run_denies_as_explain_said(ran, said)
        return said
    out = json.loads(ran.stdout)
    assert out["decision"]["decision"] == "allow", out
    assert out["result"]["ok"] is True, (said["trace"], out["result"])
    assert out["result"]["out"]["stdout"].strip() == f"RAN {cwd}", out["result"]
    return said


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cwd_in_the_executors_own_view(tmp_path: Path, backend: str) -> None:
    said = _agree(*_files(tmp_path, backend, "cwd"))
    assert said["decision"] == "allow", said
    facts = [s for s in said["trace"] if s["node"] == "fact"]  # type: ignore[union-attr,index]
    view = "docker view" if backend == "docker" else "view"
    assert any(view in s["detail"] and "cwd" in s["detail"] for s in facts), facts


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_workspace_absent_on_the_host(tmp_path: Path, backend: str) -> None:
    said = _agree(*_files(tmp_path, backend, "absent-workspace"))
    if backend == "docker":  # the container has its workspace whatever this host holds
        assert said["decision"] == "allow", said
    else:
        assert said["decision"] == "deny", said
        assert str(said["reason"]).endswith(" view)"), said["reason"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_state_directory_under_root_fs(tmp_path: Path, backend: str) -> None:
    said = _agree(*_files(tmp_path, backend, "state-under-root"))
    if backend == "docker":  # N6: refused alike, naming the view
        assert said["decision"] == "deny", said
        assert "would lie beneath root_fs" in str(said["reason"])
        assert "(docker view)" in str(said["reason"])


@pytest.mark.parametrize("backend", ["proc-bwrap", "docker"])
def test_declared_facts_inconsistent_with_the_view_are_decided_on_the_view(
        tmp_path: Path, backend: str) -> None:
    """A request declaring its cwd absent (and, for proc, a directory that is there) is decided
    on the executor's view, by explain --config and the run alike; the trace says the declared
    facts were not used and names the one the host view contradicts."""
    args, cwd = _files(tmp_path, backend, "cwd")
    req = json.loads((tmp_path / "req.json").read_text())
    req["facts"] = {cwd: "absent"}
    (tmp_path / "req.json").write_text(json.dumps(req))
    said = _agree(args, cwd)
    assert said["decision"] == "allow", said
    notes = [s["detail"] for s in said["trace"]  # type: ignore[union-attr,index]
             if s["node"] == "fact" and "declared facts not used" in s["detail"]]
    assert len(notes) == 1, said["trace"]
    if backend != "docker":  # the host has the directory the request says is absent
        assert f"`{cwd}` declared absent, the host view says dir" in notes[0]


ENV_PRINT = "import os; print('RAN', os.getcwd(), os.environ['PE_ARTIFACTS_DIR'])"


@pytest.mark.parametrize("backend", ["proc-bwrap", "docker"])
def test_a_session_workspace_at_its_own_path(tmp_path: Path, backend: str) -> None:
    """Both backends run a session's call at the host path of its workspace (docker binds the
    root there); explain names the engine's PE_ARTIFACTS_DIR and the run's process gets it.
    Before: docker refused every cwd outside /workspace/work, explain and run alike."""
    args, cwd = _files(tmp_path, backend, "session")
    req = json.loads((tmp_path / "req.json").read_text())
    req["op"]["args"] = ["-c", ENV_PRINT]
    (tmp_path / "req.json").write_text(json.dumps(req))
    dry = _cli("explain", *args, "--format", "json")
    said = json.loads(dry.stdout)
    assert said["decision"] == "allow", said
    facts = " | ".join(s["detail"] for s in said["trace"] if s["node"] == "fact")
    assert f"PE_ARTIFACTS_DIR=`{cwd}/artifacts`" in facts, facts
    if backend == "docker":
        assert f"bound at their own paths: `{tmp_path}/ws` (ro)" in facts, facts
    ran = json.loads(_cli("run", *args, "--format", "json").stdout)
    assert ran["result"]["ok"] is True, ran["result"]
    assert ran["result"]["out"]["stdout"].split() == ["RAN", cwd, f"{cwd}/artifacts"]


@pytest.mark.parametrize("backend", ["proc-bwrap", "docker"])
def test_a_session_cwd_that_is_gone(tmp_path: Path, backend: str) -> None:
    said = _agree(*_files(tmp_path, backend, "session-gone"))
    assert said["decision"] == "deny", said
    assert "does not exist" in str(said["reason"]), said["reason"]
    view = "(docker view)" if backend == "docker" else "(bwrap view)"
    assert view in str(said["reason"]), said["reason"]


def test_a_docker_session_root_holding_the_docker_projects(tmp_path: Path) -> None:
    """A root_fs above the docker workspace would bind every tenant's project into the
    container: refused by explain and run alike, naming the view."""
    said = _agree(*_files(tmp_path, "docker", "session-over-state"))
    assert said["decision"] == "deny", said
    assert "overlaps" in str(said["reason"]), said["reason"]
    assert "(docker view)" in str(said["reason"]), said["reason"]


def test_a_bound_docker_call_sees_only_what_the_profile_binds(tmp_path: Path) -> None:
    """A bound call gets bubblewrap's binds, not its whole root_fs: with fs.read on
    ``ws/work/**`` only, a file beside ``work`` is not in the container (a first cut bound
    root_fs whole: the process read it)."""
    args, cwd = _files(tmp_path, "docker", "session")
    ws = tmp_path / "ws"
    (ws / "secret.txt").write_text("s3cret")
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(policy.read_text().replace(f'["{ws}/**"]', f'["{ws}/work/**"]'))
    req = json.loads((tmp_path / "req.json").read_text())
    req["op"]["args"] = ["-c", "import os; print(os.listdir('..')); print(open('../secret.txt')"
                               ".read())"]
    (tmp_path / "req.json").write_text(json.dumps(req))
    said = json.loads(_cli("explain", *args, "--format", "json").stdout)
    assert said["decision"] == "allow", said
    facts = " | ".join(s["detail"] for s in said["trace"] if s["node"] == "fact")
    assert f"bound at their own paths: `{cwd}` (ro)" in facts, facts
    ran = json.loads(_cli("run", *args, "--format", "json").stdout)
    out = ran["result"]["out"]
    assert "s3cret" not in out["stdout"], out
    assert out["exit_code"] != 0, out
    assert out["stdout"].splitlines()[0] == "['work']", out  # only the bind's mountpoint
