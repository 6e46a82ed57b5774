"""Nothing crosses from one docker session or tenant to another (REPRO F4, F9; issue 11 items 5, 8).

Real containers on the local engine: tenant A plants IPC objects, files and a background process
in its warm container; tenant B, served by the same one-container pool right after, finds none.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor, session_key
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
    assert mine["sleeper"]
    box = one_box.pool().acquire(session_key(alice), 1).container_id
    one_box.end_session(alice)
    seen = run(one_box, bob, PROBE)
    assert one_box.pool().acquire(session_key(bob), 1).container_id != box
    assert one_box.pool().recycled == 1
    assert seen == {"shm": [], "sysv": False, "sysv_table": [], "mq": False, "sleeper": False,
                    "rootfs": []}
