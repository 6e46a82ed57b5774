"""The session runtime on real bubblewrap: lifecycle, one workspace per session, cancel on
delete and on TTL expiry (no process left behind), the per-tenant cap, owners only."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.gateway.call import Gateway
from policy_engine.gateway.session_runtime import SessionLimits, Sessions
from policy_engine.refusal import PolicyRefusal
from policy_engine.runcode.manager import OrchestratorPool

pytestmark = pytest.mark.integration

POLICY = """policy "sessions/test" version "1.0.0"
permit "py" proc.exec  tool "python3"
permit "sh" proc.exec  tool "bash"
permit "session-files" fs.read, fs.write, fs.list  paths ["{ws}/**"]
require consent when `profile.safety == "High"`
"""


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[Sessions]:
    with sessions_in(tmp_path, max_live=3, reap_interval_s=0.2) as made:
        yield made


@contextlib.contextmanager
def sessions_in(tmp_path: Path, *, docker: dict[str, Any] | None = None, max_live: int = 4,
                reap_interval_s: float = 0, proc: dict[str, Any] | None = None
                ) -> Iterator[Sessions]:
    """The session runtime over ``POLICY`` in ``tmp_path`` (workspace ``ws``, state
    ``state``), with ``docker`` as the docker executor's options (default: run-once) and
    ``proc`` as the proc executors'."""
    ws = tmp_path / "ws"
    policy = tmp_path / "s.sbpolicy"
    policy.write_text(POLICY.format(ws=ws))
    options = {name: o for name, o in (("docker", docker), ("proc", proc)) if o is not None}
    config = EngineConfig(state_dir=tmp_path / "state", options=options)
    pool = OrchestratorPool(compile_files([policy]), config)
    made = Sessions(pool, Gateway(pool.get("proc-bwrap")), config=config, workspace_root=ws,
                    limits=SessionLimits(max_live_per_tenant=max_live),
                    reap_interval_s=reap_interval_s)
    try:
        yield made
    finally:
        made.close()
        pool.close()


def _not_found(call: object) -> None:
    with pytest.raises(PolicyRefusal) as err:
        call()  # type: ignore[operator]
    assert err.value.refusal.code == "SERVICE.NOT_FOUND"
    assert err.value.refusal.http_status == 404


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_lifecycle_and_owner_only(sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", ttl_s=60, security_mode="permissive")
    assert s.backend == "proc-bwrap"
    assert s.live
    assert [x.session_id for x in sessions.list("acme", "alice")] == [s.session_id]
    assert sessions.list("acme", "bob") == []
    assert sessions.list("other", "alice") == []
    _not_found(lambda: sessions.get("acme", "bob", s.session_id))
    _not_found(lambda: sessions.get("other", "alice", s.session_id))
    _not_found(lambda: sessions.run_code("acme", "bob", s.session_id, "print(1)"))
    longer = sessions.extend("acme", "alice", s.session_id, ttl_s=3600)
    assert longer.expires_ms > s.expires_ms
    ended = sessions.delete("acme", "alice", s.session_id)
    assert ended["reason"] == "deleted"
    assert ended["workspace_removed"] is True
    _not_found(lambda: sessions.get("acme", "alice", s.session_id))
    _not_found(lambda: sessions.delete("acme", "alice", s.session_id))
    kinds = [e["event"] for e in sessions.events("acme", "alice", s.session_id)]
    assert kinds == ["created", "extended", "ended"]
    with pytest.raises(PolicyRefusal) as err:
        sessions.create("acme", "alice", ttl_s=0)
    assert err.value.refusal.code == "SCHEMA.VALIDATION_FAILED"


def test_a_file_outlives_the_call_whatever_its_risk_and_stays_in_its_session(
        sessions: Sessions) -> None:
    a = sessions.create("acme", "alice", security_mode="permissive")
    b = sessions.create("acme", "alice", security_mode="permissive")
    other = sessions.create("globex", "alice", security_mode="permissive")
    wrote = sessions.run_code("acme", "alice", a.session_id,
                              "open('note.txt', 'w').write('from a')")
    assert wrote.success, wrote
    read = sessions.run_code("acme", "alice", a.session_id, "cat note.txt", "shell")
    assert read.success, read
    assert read.stdout == "from a"
    assert read.risk.level != wrote.risk.level or read.risk.patterns != wrote.risk.patterns
    where = sessions.workspace(a) / "note.txt"
    assert where.read_text() == "from a"
    for who, sid in (("acme", b.session_id), ("globex", other.session_id)):
        relative = sessions.run_code(who, "alice", sid, "cat note.txt", "shell")
        assert not relative.success
        assert "from a" not in relative.stdout
        absolute = sessions.run_code(who, "alice", sid, f"cat {where}", "shell")
        assert "from a" not in absolute.stdout, absolute


def test_delete_cancels_the_running_call_and_leaves_no_process(sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", security_mode="permissive")
    marker = f"sleeper-{s.session_id}"
    box: dict[str, object] = {}
    runner = threading.Thread(target=lambda: box.update(r=sessions.run_code(
        "acme", "alice", s.session_id, f"import time  # {marker}\ntime.sleep(30)",
        timeout=60)))
    runner.start()
    deadline = time.monotonic() + 10
    while not _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(marker), "the call never started"
    started = time.monotonic()
    ended = sessions.delete("acme", "alice", s.session_id)
    runner.join(timeout=15)
    assert time.monotonic() - started < 10
    assert ended["calls_cancelled"] == 1
    assert ended["calls_drained"] is True
    result = box["r"]
    assert not result.success
    assert result.error_code == "TOOL.EXECUTION_FAILED"
    assert _processes_with(marker) == []
    state = sessions.config.state_dir
    lines = [json.loads(x) for p in state.rglob("*.jsonl") for x in p.read_text().splitlines()
             if result.exec_id in x]  # type: ignore[attr-defined]
    assert any("cancel" in json.dumps(x) for x in lines if x.get("type") == "end"), lines


def test_ttl_expiry_ends_the_session_and_its_process(sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", ttl_s=2, security_mode="permissive")
    marker = f"expiring-{s.session_id}"
    box: dict[str, object] = {}
    runner = threading.Thread(target=lambda: box.update(r=sessions.run_code(
        "acme", "alice", s.session_id, f"import time  # {marker}\ntime.sleep(30)",
        timeout=60)))
    runner.start()
    runner.join(timeout=15)
    assert not runner.is_alive()
    assert not box["r"].success  # type: ignore[attr-defined]
    assert _processes_with(marker) == []
    _not_found(lambda: sessions.get("acme", "alice", s.session_id))
    deadline = time.monotonic() + 10  # the reaper records the end after the call drained
    while sessions.events("acme", "alice", s.session_id)[-1]["event"] != "ended" and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    ended = sessions.events("acme", "alice", s.session_id)[-1]
    assert ended["event"] == "ended"
    assert ended["detail"]["reason"] == "expired"
    assert ended["detail"]["calls_cancelled"] == 1
    assert not sessions.workspace(s).exists()


def test_the_tenant_cap_and_the_fixed_backend(sessions: Sessions) -> None:
    made = [sessions.create("acme", f"u{i}") for i in range(3)]
    with pytest.raises(PolicyRefusal) as err:
        sessions.create("acme", "u9")
    assert err.value.refusal.http_status == 429
    assert err.value.refusal.refused_by == "limits"
    sessions.create("globex", "u0")  # another tenant's cap
    sessions.delete("acme", "u0", made[0].session_id)
    strict = sessions.create("acme", "u9", backend="proc-bwrap")
    with pytest.raises(PolicyRefusal) as blocked:  # strict: `import os` needs a container
        sessions.run_code("acme", "u9", strict.session_id, "import os\nprint(os.getpid())")
    assert blocked.value.refusal.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert blocked.value.refusal.refused_by == "backend"
    # recorded, and the answer names its evidence (outsider attack 15, F4: none, null)
    envelope = blocked.value.refusal.envelope_id
    assert envelope is not None
    logged = "".join(p.read_text() for p in sessions.config.state_dir.rglob("*.jsonl"))
    assert envelope in logged
    assert "getpid" not in logged  # the code only as its size and keyed digest
    ends = [json.loads(line) for line in logged.splitlines()
            if envelope in line and '"type":"end"' in line.replace(" ", "")]
    assert [e["sandbox_error_kind"] for e in ends] == ["capability"], ends


def test_session_files_are_guarded_ops_and_stay_in_the_session(sessions: Sessions) -> None:
    from policy_engine.gateway.session_files import SessionFiles

    files = SessionFiles(sessions, max_upload_bytes=300_000)
    s = sessions.create("acme", "alice", security_mode="permissive")
    other = sessions.create("acme", "alice", security_mode="permissive")
    blob = bytes(range(256)) * 1000  # 256 000 bytes: four guarded reads
    up = files.upload("acme", "alice", s.session_id, "data/blob.bin", blob)
    assert up["size"] == len(blob)
    assert b"".join(files.download("acme", "alice", s.session_id, "data/blob.bin")) == blob
    seen = sessions.run_code("acme", "alice", s.session_id,
                             "import hashlib; print(len(open('data/blob.bin','rb').read()))")
    assert seen.stdout == f"{len(blob)}\n", seen
    listed = files.list("acme", "alice", s.session_id)
    assert "data/blob.bin" in {e["path"] for e in listed["entries"]}, listed
    # nothing of another session; only the artifacts directory every session starts with
    assert [e["path"] for e in files.list("acme", "alice", other.session_id)["entries"]] == [
        "artifacts"]
    with pytest.raises(PolicyRefusal) as big:
        files.upload("acme", "alice", s.session_id, "big.bin", b"x" * 300_001)
    assert big.value.refusal.http_status == 413
    assert not (sessions.workspace(s) / "big.bin").exists()
    for bad in ("../escape", "/etc/passwd", ""):
        with pytest.raises(PolicyRefusal) as err:
            files.upload("acme", "alice", s.session_id, bad, b"x")
        assert err.value.refusal.code == "SCHEMA.VALIDATION_FAILED"
    _not_found(lambda: files.download("acme", "bob", s.session_id, "data/blob.bin"))
    # alice's other session has no such file: a missing file, not another session's
    with pytest.raises(PolicyRefusal) as elsewhere:
        files.download("acme", "alice", other.session_id, "data/blob.bin")
    assert elsewhere.value.refusal.code == "TOOL.NOT_FOUND"
    gone = files.delete("acme", "alice", s.session_id, "data/blob.bin")
    assert len(gone["envelope_id"]) == 32
    assert not (sessions.workspace(s) / "data" / "blob.bin").exists()
    # the file is gone: the answer every face gives a missing file, not "no such session"
    with pytest.raises(PolicyRefusal) as again:
        files.delete("acme", "alice", s.session_id, "data/blob.bin")
    assert (again.value.refusal.code, again.value.refusal.http_status,
            again.value.refusal.refused_by) == ("TOOL.NOT_FOUND", 404, "backend")
    # the message names no host path: a session sees its workspace, not where the host keeps it
    assert str(sessions.workspace(s)) not in again.value.refusal.message
    with pytest.raises(PolicyRefusal) as read:
        files.download("acme", "alice", s.session_id, "data/blob.bin")
    assert (read.value.refusal.code, read.value.refusal.refused_by) == ("TOOL.NOT_FOUND",
                                                                        "backend")
    assert str(sessions.workspace(s)) not in read.value.refusal.message, read.value
    assert "`data/blob.bin`" in read.value.refusal.message, read.value
    # a secret the host put in the workspace is masked in the sandbox: deleting it fails (the
    # mask is a mount point), says so as a failure rather than "not found", and leaves it
    secret = sessions.workspace(s) / ".env"
    secret.write_text("TOKEN=x")
    with pytest.raises(PolicyRefusal) as masked:
        files.delete("acme", "alice", s.session_id, ".env")
    assert (masked.value.refusal.code, masked.value.refusal.retryable) == (
        "TOOL.EXECUTION_FAILED", False), masked.value.refusal
    assert secret.read_text() == "TOKEN=x"
    # a refusal names the path as the caller wrote it, never where the host keeps the
    # workspace (attack 36: a masked file and a symlink out of the root showed the host path)
    (sessions.workspace(s) / "out-link").symlink_to("/etc/hostname")
    for name in (".env", "out-link"):
        with pytest.raises(PolicyRefusal) as refused:
            files.download("acme", "alice", s.session_id, name)
        assert refused.value.refusal.http_status == 403, refused.value.refusal
        assert str(sessions.workspace(s)) not in refused.value.refusal.message, refused.value
        assert f"`{name}`" in refused.value.refusal.message, refused.value.refusal.message
    state = sessions.config.state_dir
    evidence = "\n".join(p.read_text() for p in state.rglob("*.jsonl"))
    assert up["envelope_id"] in evidence
    assert gone["envelope_id"] in evidence


def test_running_calls_are_capped_per_session(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    policy = tmp_path / "s.sbpolicy"
    policy.write_text(POLICY.format(ws=ws))
    config = EngineConfig(state_dir=tmp_path / "state")
    pool = OrchestratorPool(compile_files([policy]), config)
    rt = Sessions(pool, Gateway(pool.get("proc-bwrap")), config=config, workspace_root=ws,
                  limits=SessionLimits(max_running_per_session=1), reap_interval_s=0)
    try:
        s = rt.create("acme", "alice", security_mode="permissive")
        runner = threading.Thread(target=rt.run_code, args=(
            "acme", "alice", s.session_id, "import time\ntime.sleep(30)"))
        runner.start()
        deadline = time.monotonic() + 10
        while not rt._live.get(s.session_id) or not rt._live[s.session_id].running:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(PolicyRefusal) as err:
            rt.run_code("acme", "alice", s.session_id, "print(1)")
        assert err.value.refusal.http_status == 429
        assert err.value.refusal.refused_by == "limits"
        other = rt.create("acme", "alice", security_mode="permissive")
        assert rt.run_code("acme", "alice", other.session_id, "print(1)").stdout == "1\n"
        rt.delete("acme", "alice", s.session_id)
        runner.join(timeout=15)
        assert not runner.is_alive()
    finally:
        rt.close()
        pool.close()


def test_ending_a_docker_session_releases_its_warm_container(sessions: Sessions) -> None:
    """The docker executor's `release_bound` is called for the session's own workspace (its
    warm container is removed: tests/integration/test_docker_sessions.py); an owner may have
    several docker sessions (each its own workspace and container); a bubblewrap session has
    no container to release."""
    s = sessions.create("acme", "alice", backend="docker")
    assert s.backend == "docker"
    second = sessions.create("acme", "alice", backend="docker")  # was refused: one project
    assert second.session_id != s.session_id
    ended = sessions.delete("acme", "alice", s.session_id)
    assert ended["pool_released"] is True
    plain = sessions.create("acme", "alice", backend="proc-bwrap")
    assert sessions.delete("acme", "alice", plain.session_id)["pool_released"] is False
