"""A session's live interpreter under masks that changed since it started (outsider attack 35,
F1 and F2), on real bubblewrap and the real docker engine.

Before: the interpreter kept the mount namespace (proc-bwrap) or the warm container (docker) it
started with, so a `.env` the host wrote into the workspace (or into a system tree) after that
was masked for a plain call and printed by the next stateful one; on docker every plain call
then waited 30 s for the interpreter's hold on the container and ended ``LLM.TIMEOUT``. Now each
stateful call plans the masks its plain twin would get and restarts the interpreter when they
differ, saying so (``fresh``, ``state_lost``: "the masks changed"); docker's re-made container
stops the interpreter first, so a plain call never waits on it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.gateway.session_runtime import Sessions
from policy_engine.runcode.manager import RunCodeResult
from tests.integration.test_sessions_runtime import sessions_in

pytestmark = pytest.mark.integration

SETTLE_S = 2.5  # past the mask store's 2-s rule: the plant is an old change when planned


@pytest.fixture
def system_tree() -> Iterator[Path]:
    """A host tree bound read-only into every sandbox of the test, beside /usr (the same code
    path): a secret planted under the host's /usr/share changed the masks of every sandbox of
    every test running meanwhile. Outside /tmp, which a bwrap sandbox has of its own."""
    tree = Path(tempfile.mkdtemp(prefix="pe-systree-", dir="/var/tmp"))
    tree.chmod(0o755)
    yield tree
    shutil.rmtree(tree, ignore_errors=True)


@pytest.fixture
def proc(tmp_path: Path, system_tree: Path) -> Iterator[Sessions]:
    with sessions_in(tmp_path, proc={"extra_ro_binds": [str(system_tree)]}) as made:
        yield made


@pytest.fixture
def dock(tmp_path: Path, system_tree: Path) -> Iterator[Sessions]:
    with sessions_in(tmp_path, docker={"mode": "pool", "pool_size": 1,
                                       "system_binds": ["/usr", str(system_tree)]}) as made:
        yield made


@pytest.fixture
def system_dir(system_tree: Path) -> Iterator[Path]:
    """A fresh directory in a system tree (what a package or a deploy could write)."""
    path = system_tree / f"pe-stalemask-{secrets.token_hex(4)}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _reader(paths: list[str]) -> str:
    return (f"for p in {paths!r}:\n    try:\n        print(p, repr(open(p).read()))\n"
            "    except Exception as e:\n        print(p, type(e).__name__)")


def _run(rt: Sessions, sid: str, code: str, **kw: Any) -> RunCodeResult:
    return rt.run_code("acme", "alice", sid, code, stateful=True, **kw)


def _plant(work: Path, secret: str, system: Path | None) -> list[str]:
    """The host writes secrets into the session's workspace (and a system tree)."""
    time.sleep(SETTLE_S)
    (work / "d").mkdir(exist_ok=True)
    for rel in (".env", "d/.env", "credentials.json"):
        (work / rel).write_text(secret)
    paths = [".env", "d/.env", "credentials.json"]
    if system is not None:
        system.mkdir()
        (system / ".env").write_text(secret)
        os.chmod(system / ".env", 0o644)
        paths.append(str(system / ".env"))
    time.sleep(SETTLE_S)
    return paths


def _ended(rt: Sessions, sid: str) -> list[str]:
    return [e["detail"]["reason"] for e in rt.events("acme", "alice", sid)
            if e["event"] == "interpreter_ended"]


def test_proc_a_secret_planted_after_the_start_restarts_the_interpreter_masked(
        proc: Sessions, system_dir: Path) -> None:
    s = proc.create("acme", "alice", security_mode="permissive", backend="proc-bwrap")
    work = proc.workspace(s)
    first = _run(proc, s.session_id, "x = 1\nprint('started')")
    assert first.interpreter == {"generation": 1, "fresh": True, "state_lost": None}, first
    same = _run(proc, s.session_id, "x += 1\nprint(x)")  # nothing changed: no restart
    assert same.stdout == "2\n"
    assert same.interpreter == {"generation": 1, "fresh": False, "state_lost": None}
    secret = "PESECRET_" + secrets.token_hex(6)
    paths = _plant(work, secret, system_dir)
    plain = proc.run_code("acme", "alice", s.session_id, _reader(paths))
    assert plain.success, plain
    assert secret not in plain.stdout + plain.stderr
    assert plain.stdout.count("PermissionError") == len(paths), plain.stdout
    stateful = _run(proc, s.session_id, _reader(paths) + "\nprint('x' in dir())")
    assert stateful.success, stateful
    assert secret not in stateful.stdout + stateful.stderr, stateful.stdout
    assert stateful.stdout.count("PermissionError") == len(paths), stateful.stdout
    assert stateful.stdout.endswith("False\n")  # its variables are gone, and it says so
    assert stateful.interpreter is not None
    assert stateful.interpreter["fresh"] is True
    assert stateful.interpreter["generation"] == 2
    assert "masks changed" in stateful.interpreter["state_lost"]
    assert secret not in stateful.interpreter["state_lost"]
    assert any("masks changed" in r for r in _ended(proc, s.session_id))
    # the new interpreter started under the new masks: the next call keeps it
    again = _run(proc, s.session_id, "y = 3\nprint(open('d/x', 'w').write('ok'))")
    assert again.interpreter == {"generation": 2, "fresh": False, "state_lost": None}, again


def test_proc_a_secret_the_code_itself_writes_is_masked_on_the_next_call(
        proc: Sessions) -> None:
    s = proc.create("acme", "alice", security_mode="permissive", backend="proc-bwrap")
    secret = "PESECRET_" + secrets.token_hex(6)
    wrote = _run(proc, s.session_id, f"open('.env', 'w').write({secret!r})\nv = 1")
    assert wrote.success, wrote
    time.sleep(SETTLE_S)
    read = _run(proc, s.session_id, _reader([".env"]))
    assert secret not in read.stdout, read.stdout  # as a plain call would see it: masked
    assert read.interpreter is not None
    assert read.interpreter["generation"] == 2
    assert "masks changed" in read.interpreter["state_lost"]


def test_docker_a_secret_planted_after_the_start_restarts_it_and_plain_calls_never_wait(
        dock: Sessions) -> None:
    s = dock.create("acme", "alice", backend="docker")
    work = dock.workspace(s)
    assert _run(dock, s.session_id, "x = 1").success
    plain = dock.run_code("acme", "alice", s.session_id, "echo ok", language="shell")
    assert plain.stdout == "ok\n", plain  # with the interpreter alive
    secret = "PESECRET_" + secrets.token_hex(6)
    paths = _plant(work, secret, None)
    t0 = time.monotonic()
    after = dock.run_code("acme", "alice", s.session_id, "cat .env d/.env credentials.json; "
                          "echo ok", language="shell", timeout=20)
    took = time.monotonic() - t0
    assert after.success, after
    assert after.stdout == "ok\n", after  # masked (empty), in a re-made container
    assert took < 15, f"the plain call waited {took:.1f}s on the interpreter's container"
    stateful = _run(dock, s.session_id, _reader(paths) + "\nprint('x' in dir())")
    assert stateful.success, stateful
    assert secret not in stateful.stdout + stateful.stderr, stateful.stdout
    assert stateful.stdout.endswith("False\n")
    assert stateful.interpreter is not None
    assert stateful.interpreter["fresh"] is True
    assert stateful.interpreter["generation"] == 2
    assert "masks changed" in stateful.interpreter["state_lost"]
    assert any("masks changed" in r for r in _ended(dock, s.session_id))
    again = _run(dock, s.session_id, "print(1)")
    assert again.interpreter == {"generation": 2, "fresh": False, "state_lost": None}, again


def test_docker_a_stateful_call_first_after_the_plant_gets_the_new_masks(
        dock: Sessions) -> None:
    s = dock.create("acme", "alice", backend="docker")
    work = dock.workspace(s)
    assert _run(dock, s.session_id, "x = 1").success
    secret = "PESECRET_" + secrets.token_hex(6)
    paths = _plant(work, secret, None)
    stateful = _run(dock, s.session_id, _reader(paths))
    assert stateful.success, stateful
    assert secret not in stateful.stdout + stateful.stderr, stateful.stdout
    assert stateful.interpreter is not None
    assert "masks changed" in stateful.interpreter["state_lost"]
    with contextlib.suppress(OSError):
        (work / ".env").unlink()


def test_over_http_a_planted_secret_is_masked_for_the_stateful_call(tmp_path: Path) -> None:
    """The real server (attack 35's repro, r2, on proc-bwrap)."""
    from tests.integration.service_server import add_token, serving

    with serving(tmp_path, "--security-mode", "permissive") as svc:
        alice = add_token(svc.state, "acme", "agent:alice")
        with svc.client(alice) as c:
            sid = c.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
            url = f"/v1/sessions/{sid}"
            first = c.post(f"{url}/run_code", json={"code": "x = 1", "stateful": True}).json()
            assert first["interpreter"]["generation"] == 1, first
            [work] = [p / "work" for p in tmp_path.rglob(sid) if p.is_dir()]
            secret = "PESECRET_" + secrets.token_hex(6)
            paths = _plant(work, secret, None)
            got = c.post(f"{url}/run_code", json={"code": _reader(paths),
                                                  "stateful": True}).json()
            assert secret not in got["stdout"] + got["stderr"], got
            assert got["stdout"].count("PermissionError") == len(paths), got
            assert got["interpreter"]["fresh"] is True
            assert "masks changed" in got["interpreter"]["state_lost"], got
            events = c.get(f"{url}/events").json()["events"]
            assert any("masks changed" in e["detail"].get("reason", "") for e in events
                       if e["event"] == "interpreter_ended"), events


def test_docker_a_re_make_waits_for_the_running_stateful_call_then_stops_it(
        dock: Sessions) -> None:
    """The plain call that needs the re-made container lets a running stateful call finish
    (its output kept), then ends the interpreter; it never waits out its own deadline."""
    s = dock.create("acme", "alice", backend="docker")
    work = dock.workspace(s)
    assert _run(dock, s.session_id, "x = 1").success
    got: list[RunCodeResult] = []
    slow = threading.Thread(target=lambda: got.append(_run(
        dock, s.session_id, "import time\ntime.sleep(8)\nprint('slow done', x)", timeout=30)))
    slow.start()
    secret = "PESECRET_" + secrets.token_hex(6)
    _plant(work, secret, None)  # 5 s: the stateful call is still running when it returns
    t0 = time.monotonic()
    plain = dock.run_code("acme", "alice", s.session_id, "cat .env; echo ok", language="shell",
                          timeout=25)
    took = time.monotonic() - t0
    slow.join(30)
    assert got, "the stateful call answered"
    assert got[0].success, got
    assert got[0].stdout == "slow done 1\n"  # not killed by the re-make
    assert plain.success, plain
    assert plain.stdout == "ok\n"
    assert took < 15, f"{took:.1f}s"
    after = _run(dock, s.session_id, "print('x' in dir())")
    assert after.stdout == "False\n", after
    assert after.interpreter is not None
    assert "masks changed" in after.interpreter["state_lost"]
