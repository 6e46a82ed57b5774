"""Nothing crosses from one docker session or tenant to another (REPRO F4, F9; issue 11 items 5, 8).

Real containers on the local engine: tenant A plants IPC objects, files and a background process
in its warm container; tenant B, served by the same one-container pool right after, finds none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor, session_key
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import (
    AllowLists,
    Budget,
    DenyLists,
    Limits,
    Mappings,
    NetworkMode,
    ProcExecOp,
    Profile,
    SafetyClass,
    SideEffect,
)

pytestmark = pytest.mark.integration

# Tenant A's session: every kind of state a process can leave in its container.
PLANT = r"""
import ctypes, os, subprocess
libc = ctypes.CDLL("libc.so.6", use_errno=True)
open("/dev/shm/LEAK-SHM", "w").write("alice-secret-shm")
libc.shmget.restype = ctypes.c_int
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x5EED, 4096, 0o1666)  # IPC_CREAT | 0666
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b"alice-secret-sysv", 17)
libc.mq_open.restype = ctypes.c_int
mq = libc.mq_open(b"/leakq", os.O_CREAT | os.O_RDWR, 0o666, None)
subprocess.Popen(["/usr/bin/sleep", "4242"], start_new_session=True)
planted = {"shm": os.listdir("/dev/shm"), "sysv": shm >= 0, "mq": mq >= 0}
for d in ("/var/tmp", "/home", "/run/lock"):
    try:
        open(f"{d}/LEAK-ROOTFS", "w").write("alice")
        planted[d] = True
    except OSError:
        pass
print(__import__("json").dumps(planted))
"""

# Tenant B's session: look for every one of them.
PROBE = r"""
import ctypes, json, os
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.shmget.restype = ctypes.c_int
libc.mq_open.restype = ctypes.c_int
marker = "sleep\0" + str(4200 + 42)  # not a literal: this script's own argv would match
procs = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            procs.append(open(f"/proc/{p}/cmdline").read())
        except OSError:
            pass
print(json.dumps({
    "shm": os.listdir("/dev/shm"),
    "sysv": libc.shmget(0x5EED, 0, 0) >= 0,
    "sysv_table": open("/proc/sysvipc/shm").read().splitlines()[1:],
    "mq": libc.mq_open(b"/leakq", os.O_RDONLY, 0, None) >= 0,
    "sleeper": any(marker in c for c in procs),
    "rootfs": [d for d in ("/var/tmp", "/home", "/run/lock")
               if os.path.exists(f"{d}/LEAK-ROOTFS")],
}))
"""


def make_profile(root: Path, tenant: str, subject: str) -> Profile:
    return Profile(
        tenant=tenant, subject_id=subject, tool_name="py", call_id=f"call-{tenant}",
        safety=SafetyClass.LOW, side_effects=(SideEffect.PROCESS,), limits=Limits(),
        budget=Budget(), allow=AllowLists(), deny=DenyLists(),
        mappings=Mappings(root_fs=str(root)), network=NetworkMode.OFF, timeout_ms=60_000,
        consent_required=False, expires_at=0, policy_name="p", policy_version="1",
        policy_version_hash="h", manifest_version="1",
    )


def run(ex: DockerExecutor, profile: Profile, code: str) -> dict[str, Any]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 90)
    out = ex.execute(ctx, ProcExecOp(tool="python3", args=("-c", code))).out
    assert out["exit_code"] == 0, out["stderr"]
    return dict(json.loads(out["stdout"]))


@pytest.fixture(params=[True, False], ids=["launcher", "docker-exec"])
def one_box(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DockerExecutor]:
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1, workspace_root=str(tmp_path),
                                      pool_launcher=request.param))
    yield ex
    ex.close()


def test_the_next_tenant_finds_nothing_of_the_last(one_box: DockerExecutor,
                                                   tmp_path: Path) -> None:
    alice = make_profile(tmp_path, "acme", "agent:alice")
    bob = make_profile(tmp_path, "globex", "agent:bob")
    planted = run(one_box, alice, PLANT)
    assert planted["shm"] == ["LEAK-SHM"]
    assert planted["sysv"]
    assert planted["mq"]
    # what A sees of its own session is still there while the session lasts
    mine = run(one_box, alice, PROBE)
    assert mine["sysv"]
    # but no process: a call's background child does not outlive the call (issue 32 item 3)
    assert not mine["sleeper"]
    box = one_box.pool().acquire(session_key(alice), 1).container_id
    one_box.end_session(alice)
    seen = run(one_box, bob, PROBE)
    assert one_box.pool().acquire(session_key(bob), 1).container_id != box
    assert one_box.pool().recycled == 1
    assert seen == {"shm": [], "sysv": False, "sysv_table": [], "mq": False, "sleeper": False,
                    "rootfs": []}


# --- tenants and subjects map to distinct projects (item 8) ------------------------------------

COLLIDING = [
    [("acme", "x--y"), ("acme--x", "y")],
    [("acme", "agent:alice"), ("acme", "agent/alice"), ("acme", "agent_alice")],
]
WRITE = ("import os, pathlib; w = pathlib.Path('/workspace/work')\n"
         "seen = sorted(os.listdir(w))\n"
         "(w / ('mark-' + __import__('sys').argv[1])).write_text('x')\n"
         "print(__import__('json').dumps(seen))")


@pytest.mark.parametrize("group", COLLIDING, ids=["double-dash", "separators"])
def test_colliding_names_get_separate_work_dirs(tmp_path: Path,
                                                group: list[tuple[str, str]]) -> None:
    ex = DockerExecutor(DockerOptions(workspace_root=str(tmp_path / "docker")))
    try:
        for n, (tenant, subject) in enumerate(group):
            prof = make_profile(tmp_path, tenant, subject)
            ctx = ExecContext(profile=prof, deadline=time.monotonic() + 90)
            # argv, not env: the profile has no capability whose allow-list admits a variable
            out = ex.execute(ctx, ProcExecOp(tool="python3", args=("-c", WRITE, str(n)))).out
            assert out["exit_code"] == 0, out["stderr"]
            assert json.loads(out["stdout"]) == [], f"{tenant}/{subject} saw another's work/"
    finally:
        ex.close()
    ids = sorted(p.name for p in (tmp_path / "docker" / "projects").iterdir())
    assert len(ids) == len(group)
    assert all(i.startswith("acme--") for i in ids)  # still readable


def test_projects_default_to_the_state_dir_outside_root_fs(tmp_path: Path) -> None:
    fs_root = tmp_path / "workspace"
    fs_root.mkdir()
    prof = make_profile(fs_root, "acme", "agent:alice")
    ex = DockerExecutor(DockerOptions(), state_dir=tmp_path / "state")
    try:
        ctx = ExecContext(profile=prof, deadline=time.monotonic() + 90)
        out = ex.execute(ctx, ProcExecOp(tool="python3", args=("-c", "print(1)"))).out
        assert Path(out["artifacts_dir"]).is_relative_to(tmp_path / "state" / "docker")
        assert list(fs_root.iterdir()) == []
        inside = DockerExecutor(DockerOptions(), state_dir=fs_root / "var")
        with pytest.raises(PolicyEngineError) as exc:
            inside.execute(ExecContext(profile=prof, deadline=time.monotonic() + 90),
                           ProcExecOp(tool="python3", args=("-c", "print(1)")))
        assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
        assert "root_fs" in exc.value.reason
        assert not (fs_root / "var").exists()
    finally:
        ex.close()


# --- REPRO F9 through the CLI with the shipped example policy ----------------------------------

REPO = Path(__file__).resolve().parents[2]
RED_POLICY = """policy "redteam/proc" version "1.0.0"
defaults { timeout 20s  network off }
permit "read-ws" fs.read, fs.list paths ["/workspace/**"]
permit "write-work" fs.write paths ["/workspace/work/**"]
permit "py" proc.exec tool "python3"
require consent when `false`
"""


def _cli(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--state-dir", str(state),
         "--format", "json", *args],
        capture_output=True, text=True, timeout=180, check=False, cwd=REPO,
        env={**os.environ, "POLICY_ENGINE_STATE": str(state)})


def test_cli_other_tenant_cannot_read_or_list_a_docker_project(tmp_path: Path) -> None:
    state = tmp_path / "state"
    marker = f"TENANTRED-MARKER-{os.getpid()}-{time.time_ns()}"
    cap = [{"kind": "proc.exec", "tool": "python3"},
           {"kind": "fs.read", "paths": ["/workspace/**"]},
           {"kind": "fs.write", "paths": ["/workspace/work/**"]}]
    (tmp_path / "red.sbpolicy").write_text(RED_POLICY)
    (tmp_path / "red-manifest.json").write_text(json.dumps({
        "name": "rt", "version": "1.0.0", "permissions": cap,
        "side_effects": ["Process", "Read", "Write"], "safety_class": "Medium"}))
    (tmp_path / "red-grant.json").write_text(json.dumps({
        "tenant": "red", "subject_id": "agent:rt-1", "tool_name": "rt", "call_id": "c-red",
        "capabilities": cap, "expires_at": 4102444800000}))
    (tmp_path / "docker.yaml").write_text(
        "backends:\n  proc.exec: docker\noptions:\n  docker: {mode: run-once}\n")
    red = _cli("--config", str(tmp_path / "docker.yaml"), "--policy",
               str(tmp_path / "red.sbpolicy"), "--manifest", str(tmp_path / "red-manifest.json"),
               "--grant", str(tmp_path / "red-grant.json"), "--", "python3", "-c",
               f"open('/workspace/work/tenant-secret.txt', 'w').write('{marker}')", state=state)
    assert red.returncode == 0, red.stdout + red.stderr
    artifacts = Path(json.loads(red.stdout)["result"]["out"]["artifacts_dir"])
    secret = artifacts.parents[1] / "work" / "tenant-secret.txt"
    assert secret.read_text() == marker
    assert not secret.is_relative_to("/workspace")
    project = artifacts.parents[1].name
    legacy = Path("/workspace/projects/red--agent_rt-1/work/tenant-secret.txt")
    # tenant acme, the shipped example policy (fs.read/fs.list on /workspace/** by the rule
    # `read-workspace`), its grant and manifest plus fs.list
    listing = {"kind": "fs.list", "paths": ["/workspace/**"]}
    grant = json.loads((REPO / "examples/grants/shell-agent.json").read_text())
    grant["capabilities"].append(listing)
    (tmp_path / "acme-grant.json").write_text(json.dumps(grant))
    manifest = json.loads((REPO / "examples/manifests/shell.json").read_text())
    manifest["permissions"].append(listing)
    (tmp_path / "acme-manifest.json").write_text(json.dumps(manifest))
    Path("/workspace").mkdir(exist_ok=True)
    ops: list[dict[str, Any]] = [
        {"kind": "fs.read", "path": str(secret)}, {"kind": "fs.read", "path": str(legacy)},
        {"kind": "fs.list", "path": "/workspace", "depth": 3}]
    for i, op in enumerate(ops):
        (tmp_path / f"req{i}.json").write_text(json.dumps({
            "op": op, "manifest": str(tmp_path / "acme-manifest.json"),
            "grant": str(tmp_path / "acme-grant.json")}))
        acme = _cli("--policy", str(REPO / "examples/policies/org.sbpolicy"), "--request",
                    str(tmp_path / f"req{i}.json"), state=state)
        assert marker not in acme.stdout + acme.stderr
        assert "Traceback" not in acme.stderr
        result = json.loads(acme.stdout)["result"]
        if op["kind"] == "fs.read":  # refused (outside root_fs) or absent, never read
            assert not result["ok"]
            assert acme.returncode == 1
        else:
            assert result["ok"], result
            assert project not in json.dumps(result["out"])
