"""Docker sessions on the real engine (issue 28 items 2 and 3): each session its own workspace,
bound at its own host path in its own warm container; files written by one call are there for
the next and for the files API; two sessions of one token, and two tenants, never see each
other's files; ending the session removes its container (``docker ps``) and its workspace;
session code finds its artifacts directory in ``PE_ARTIFACTS_DIR`` on both backends.

Before: docker session calls ran in the token's project (``/workspace/work`` per tenant and
subject, container-local in pool mode), so an upload was not there for the call, a second
docker session of the owner was refused, and no variable named an artifacts directory."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from plugins.executor_docker.pool import POOL_LABEL
from plugins.executor_proc.idmap import IDMAP_DIR
from policy_engine import PolicyEngineError
from policy_engine.gateway.session_files import SessionFiles
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.refusal import PolicyRefusal
from policy_engine.runcode.manager import RunCodeResult
from tests.integration.test_docker_write_identity import mount_points
from tests.integration.test_sessions_runtime import sessions_in

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Sessions]:
    with sessions_in(tmp_path, docker={"mode": "pool", "pool_size": 1}) as made:
        yield made


def _containers_binding(path: Path) -> list[str]:
    """Ids of the running pool containers with ``path`` bound at its own path (from the
    workspace's id-mapped mount: it stays root's, plugins/executor_docker/identity.py)."""
    client = docker.from_env()
    try:
        found = []
        # other tests' pool containers come and go meanwhile: one gone between the list and
        # its inspection is not ours (docker-py raised NotFound for it, seen at -n 3)
        for c in client.containers.list(filters={"label": POOL_LABEL}, ignore_removed=True):
            if any(m.get("Source", "").startswith(f"{IDMAP_DIR}/")
                   and m.get("Destination") == str(path)
                   for m in c.attrs.get("Mounts", [])):
                found.append(str(c.id))
        return found
    finally:
        client.close()


def _mapped_source(container_id: str, path: Path) -> str:
    """The host source of the container's bind at ``path``."""
    client = docker.from_env()
    try:
        mounts = client.containers.get(container_id).attrs.get("Mounts", [])
        return str(next(m["Source"] for m in mounts if m.get("Destination") == str(path)))
    finally:
        client.close()


def _ok(res: RunCodeResult) -> str:
    assert res.success, res
    return res.stdout


def test_two_docker_sessions_of_one_token_and_two_tenants_share_nothing(rt: Sessions) -> None:
    a = rt.create("acme", "alice", backend="docker")
    b = rt.create("acme", "alice", backend="docker")  # a second one of the owner: allowed
    other = rt.create("globex", "alice", backend="docker")
    work = rt.workspace(a)
    wrote = _ok(rt.run_code("acme", "alice", a.session_id,
                            "import os\nopen('note.txt', 'w').write('from a')\n"
                            "print(os.getcwd())"))
    assert wrote.strip() == str(work)  # the host path: the same as on bubblewrap
    assert (work / "note.txt").read_text() == "from a"
    # the next call of the session, a shell one (another risk, the same container), reads it
    assert _ok(rt.run_code("acme", "alice", a.session_id, "cat note.txt", "shell")) == "from a"
    for who, sid in (("acme", b.session_id), ("globex", other.session_id)):
        relative = rt.run_code(who, "alice", sid, "cat note.txt", "shell")
        absolute = rt.run_code(who, "alice", sid, f"cat {work}/note.txt; ls {work.parent}",
                               "shell")
        assert not relative.success, relative
        assert "from a" not in relative.stdout, relative
        assert not absolute.success, absolute
        assert "from a" not in absolute.stdout, absolute
    # each session runs in its own container, binding its own workspace
    held = {s.session_id: _containers_binding(rt.workspace(s)) for s in (a, b, other)}
    assert all(len(ids) == 1 for ids in held.values()), held
    assert len({ids[0] for ids in held.values()}) == 3, held


def test_files_api_and_calls_see_one_workspace(rt: Sessions) -> None:
    files = SessionFiles(rt)
    s = rt.create("acme", "alice", backend="docker")
    files.upload("acme", "alice", s.session_id, "data/in.csv", b"a,b\n1,2\n")
    out = _ok(rt.run_code("acme", "alice", s.session_id,
                          "import csv\nrows = list(csv.reader(open('data/in.csv')))\n"
                          "open('data/out.txt', 'w').write(str(len(rows)))\n"
                          "open('data/in.csv', 'a').write('3,4\\n')\nprint(len(rows))"))
    assert out == "2\n"
    assert b"".join(files.download("acme", "alice", s.session_id, "data/out.txt")) == b"2"
    # an upload the engine wrote (as root) is appendable through the id-mapped bind, and
    # nothing changed owner
    assert b"".join(files.download("acme", "alice", s.session_id,
                                   "data/in.csv")) == b"a,b\n1,2\n3,4\n"
    names = {e["path"] for e in files.list("acme", "alice", s.session_id)["entries"]}
    assert {"data", "data/in.csv", "data/out.txt"} <= names, names
    work = rt.workspace(s)
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [work, *work.rglob("*")]}
    assert owners == {(0, 0)}, owners  # the engine's workspace stays the engine's


@pytest.mark.parametrize("backend", ["docker", "proc-bwrap"])
def test_code_finds_its_artifacts_directory(rt: Sessions, backend: str) -> None:
    files = SessionFiles(rt)
    s = rt.create("acme", "alice", backend=backend, security_mode="permissive")
    shell = 'printf chart > "$PE_ARTIFACTS_DIR/plot.txt"; echo "$PE_ARTIFACTS_DIR"'
    where = _ok(rt.run_code("acme", "alice", s.session_id, shell, "shell")).strip()
    assert where == str(rt.workspace(s) / "artifacts")
    assert b"".join(files.download("acme", "alice", s.session_id,
                                   "artifacts/plot.txt")) == b"chart"
    if backend == "docker":  # python's risk (import os) needs docker in permissive mode
        code = ("import os\nd = os.environ['PE_ARTIFACTS_DIR']\n"
                "open(os.path.join(d, 'fig.txt'), 'w').write('fig')\nprint(d)")
        assert _ok(rt.run_code("acme", "alice", s.session_id, code)).strip() == where
        assert b"".join(files.download("acme", "alice", s.session_id,
                                       "artifacts/fig.txt")) == b"fig"


def test_delete_removes_the_sessions_container_and_workspace(rt: Sessions) -> None:
    s = rt.create("acme", "alice", backend="docker")
    root = rt.workspace(s)
    marker = "MK-RETAINED-CODE"
    _ok(rt.run_code("acme", "alice", s.session_id, f"open('x', 'w').write('1')  # {marker}"))
    # the per-exec records of the session's project: meta.json holds the argv (the code)
    records = [p for p in (rt.config.state_dir / "docker" / "projects").rglob("*")
               if p.is_file() and marker in p.read_text(errors="replace")]
    assert records, "the call's record names its code"
    held = _containers_binding(root)
    assert len(held) == 1, held
    mapped = _mapped_source(held[0], root)
    assert mapped in mount_points(), mapped  # the container's id-mapped bind of the workspace
    ended = rt.delete("acme", "alice", s.session_id)
    assert ended["pool_released"] is True, ended
    assert ended["workspace_removed"] is True, ended
    assert _containers_binding(root) == []  # removed before the delete answered
    deadline = time.monotonic() + 10  # detached in the background once the container is gone
    while mapped in mount_points() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mapped not in mount_points()
    assert not os.path.exists(mapped), mapped
    assert not root.parent.exists()
    # outsider attack 15, F3: the session's code and output stayed on disk after its end
    assert [p for p in records if p.exists()] == []
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(held[0])
    finally:
        client.close()
    last = rt.events("acme", "alice", s.session_id)[-1]
    assert last["event"] == "ended", last
    assert last["detail"]["pool_released"] is True, last


def test_the_container_is_made_at_create(rt: Sessions) -> None:
    """A docker session's own warm container is made while the caller goes on (pool mode):
    it is there before the first call."""
    s = rt.create("acme", "alice", backend="docker")
    root = rt.workspace(s)
    deadline = time.monotonic() + 30
    while not _containers_binding(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    held = _containers_binding(root)
    assert len(held) == 1, held
    _ok(rt.run_code("acme", "alice", s.session_id, "print(1)"))
    assert _containers_binding(root) == held  # the first call used it


def test_a_denied_file_that_appears_later_is_masked_in_the_warm_container(
        rt: Sessions) -> None:
    """The session's container outlives its calls, and masks are mounts made with it: a file
    under a mandatory deny (``**/.env``) that appears after it was made must still be hidden
    from the next call, as bubblewrap hides it (masks are planned per call). The container is
    re-made with the call's masks; the file stays on the host, unread."""
    s = rt.create("acme", "alice", backend="docker")
    work = rt.workspace(s)
    _ok(rt.run_code("acme", "alice", s.session_id, "print(1)"))
    before = _containers_binding(work)
    (work / ".env").write_text("TOKEN=s3cret\n")  # planted beside the sandbox, not uploaded
    seen = rt.run_code("acme", "alice", s.session_id, "cat .env; echo end", "shell")
    assert "s3cret" not in seen.stdout, seen
    assert seen.stdout.strip().endswith("end"), seen
    after = _containers_binding(work)
    assert len(after) == 1, after
    assert after != before, (before, after)
    assert (work / ".env").read_text() == "TOKEN=s3cret\n"


def test_ttl_expiry_removes_the_sessions_container(rt: Sessions) -> None:
    s = rt.create("acme", "alice", backend="docker", ttl_s=1)
    work = rt.workspace(s)
    _ok(rt.run_code("acme", "alice", s.session_id, "print(1)"))
    assert len(_containers_binding(work)) == 1
    time.sleep(1.2)
    with pytest.raises(PolicyRefusal):  # expired: ended on access (the reaper does it too)
        rt.get("acme", "alice", s.session_id)
    assert _containers_binding(work) == []
    assert not work.parent.exists()
    last = rt.events("acme", "alice", s.session_id)[-1]
    assert last["detail"]["reason"] == "expired", last
    assert last["detail"]["pool_released"] is True, last


def test_a_session_container_that_cannot_start_leaves_nothing(tmp_path: Path) -> None:
    """A session's container that is created but cannot start (its workspace removed between
    the two: the session ended while it was being made; here, deterministically, a file bound
    over a directory) is removed, not left behind in `Created` state (`containers.run` raised
    before the pool knew its id)."""
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1,
                                      workspace_root=str(tmp_path / "docker")))
    try:
        afile = tmp_path / "afile"
        afile.write_text("x")
        pool = ex.pool(None)
        before = {c.id for c in _pool_containers(pool.pool_id)}
        with pytest.raises(PolicyEngineError):
            pool.acquire_bound("t\x1fs\x1fbound:x", (docker.types.Mount(
                target="/usr/bin", source=str(afile), type="bind", read_only=True),),
                timeout_s=30)
        assert {c.id for c in _pool_containers(pool.pool_id)} == before
    finally:
        ex.close()


def _pool_containers(pool_id: str) -> list[Any]:
    client = docker.from_env()
    try:
        return list(client.containers.list(all=True,
                                           filters={"label": f"{POOL_LABEL}={pool_id}"}))
    finally:
        client.close()
