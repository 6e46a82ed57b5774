"""A session's stateful interpreter on real bubblewrap: one live process per session whose
variables survive calls, each call still decided and recorded on its own; a timeout, a cancel
or a crash kills it and the next call says the state was lost; nothing survives the session."""

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
from policy_engine.gateway.session_execs import SessionExecs
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.runcode.manager import OrchestratorPool, RunCodeResult

pytestmark = pytest.mark.integration

POLICY = """policy "sessions/interp" version "1.0.0"
permit "py" proc.exec  tool "python3" {limits}
permit "session-files" fs.read, fs.write, fs.list  paths ["{ws}/**"]
forbid "no-marked-code" proc.exec  tool "python3"  args ["-c", /(?s).*FORBIDDEN.*/]
require consent when `profile.safety == "High"`
"""
# the in-sandbox server's source is its command line: every process of an interpreter (host
# launcher, bwrap, python) carries this text
MARK = b"long-lived Python interpreter a stateful session runs"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Sessions, OrchestratorPool, Path]]:
    ws = tmp_path / "ws"
    policy = tmp_path / "s.sbpolicy"
    policy.write_text(POLICY.format(ws=ws, limits=""))
    config = EngineConfig(state_dir=tmp_path / "state")
    pool = OrchestratorPool(compile_files([policy]), config)
    made = Sessions(pool, Gateway(pool.get("proc-bwrap")), config=config, workspace_root=ws,
                    reap_interval_s=0.2)
    yield made, pool, policy
    made.close()
    pool.close()


@pytest.fixture
def sessions(env: tuple[Sessions, OrchestratorPool, Path]) -> Sessions:
    return env[0]


def _interpreters(sessions: Sessions) -> set[int]:
    """The live interpreters working in ``sessions``' workspaces: other tests (other workers)
    start and end interpreters of their own meanwhile, which are not this test's to count."""
    found = set()
    root = f"{sessions.root}/"
    for pid in os.listdir("/proc"):
        try:
            if MARK in Path(f"/proc/{pid}/cmdline").read_bytes() and \
                    _cwd(int(pid)).startswith(root):
                found.add(int(pid))
        except (OSError, ValueError):
            continue
    return found


def _cwd(pid: int) -> str:
    """Where ``pid`` runs (bubblewrap binds the workspace at its host path), or ``""``."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _cgroups(pid: int) -> list[Path]:
    """The engine-made cgroup directories ``pid`` is in (v1 per controller, or v2)."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, ctrls, rel = line.split(":", 2)
            if "policy-engine-" in rel:
                base = Path("/sys/fs/cgroup") / (ctrls.split(",")[0] if ctrls else "")
                found.append(base / rel.lstrip("/"))
    return found


def _evidence(sessions: Sessions) -> dict[str, dict[str, dict[str, Any]]]:
    """envelope id → {"begin": record, "end": record}."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sessions.config.state_dir.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") in ("begin", "end"):
                found.setdefault(rec["envelope_id"], {})[rec["type"]] = rec
    return found


def _run(sessions: Sessions, sid: str, code: str, **kw: Any) -> RunCodeResult:
    return sessions.run_code("acme", "alice", sid, code, stateful=True, **kw)


def test_state_survives_calls_each_decided_and_recorded_per_session(sessions: Sessions) -> None:
    a = sessions.create("acme", "alice", security_mode="permissive")
    b = sessions.create("acme", "alice", security_mode="permissive")
    before = _interpreters(sessions)
    calls = [_run(sessions, a.session_id, "import json\nx = 41\n"
                  "def twice(v):\n    return 2 * v\nclass Box:\n    n = 7"),
             _run(sessions, a.session_id, "x += 1\nprint(twice(x), json.dumps([Box.n]))")]
    assert calls[0].success, calls[0]
    assert calls[1].stdout == "84 [7]\n", calls[1]
    assert calls[0].interpreter == {"generation": 1, "fresh": True, "state_lost": None}
    assert calls[1].interpreter == {"generation": 1, "fresh": False, "state_lost": None}
    mine = _interpreters(sessions) - before
    assert mine, "a live interpreter process between calls"
    # a plain call is its own process; another session has its own interpreter
    assert not sessions.run_code("acme", "alice", a.session_id, "print(x)").success
    other = _run(sessions, b.session_id, "print(x)")
    assert not other.success
    assert "NameError" in other.stderr
    assert 'File "<cell 1>", line 1' in other.stderr  # with the line, as a notebook shows it
    assert "    print(x)" in other.stderr
    assert other.interpreter is not None
    assert other.interpreter["fresh"] is True
    assert _interpreters(sessions) - before - mine, "session b runs its own interpreter process"
    records = _evidence(sessions)
    for call in [*calls, other]:
        rec = records[call.exec_id]
        assert set(rec) == {"begin", "end"}
        assert rec["begin"]["annotations"]["stateful"] is True
        assert rec["end"]["decision"] == "allow"
        assert rec["end"]["status"] == "ok"
    assert len({c.exec_id for c in [*calls, other]}) == 3
    events = [e["event"] for e in sessions.events("acme", "alice", a.session_id)]
    assert events == ["created", "interpreter_started"]


def test_a_timeout_kills_the_interpreter_and_the_next_call_says_the_state_was_lost(
        sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", security_mode="permissive")
    before = _interpreters(sessions)
    assert _run(sessions, s.session_id, "x = 1").success
    live = _interpreters(sessions) - before
    assert live
    slow = _run(sessions, s.session_id, "import time\nprint('started', flush=True)\n"
                "time.sleep(30)", timeout=1)
    assert slow.error_code == "LLM.TIMEOUT", slow
    assert "state is lost" in (slow.error or "")
    assert not live & _interpreters(sessions), "the timed-out interpreter is gone"
    rec = _evidence(sessions)[slow.exec_id]
    assert rec["end"]["status"] == "error"
    assert rec["end"]["error_code"] == "LLM.TIMEOUT"
    after = _run(sessions, s.session_id, "print(x)")
    assert "NameError" in after.stderr, after
    assert after.interpreter is not None
    assert after.interpreter["fresh"] is True
    assert after.interpreter["generation"] == 2
    assert "timed out" in after.interpreter["state_lost"]
    ended = [e for e in sessions.events("acme", "alice", s.session_id)
             if e["event"] == "interpreter_ended"]
    assert "timed out" in ended[0]["detail"]["reason"]


def test_a_crash_is_reported_with_its_output_and_the_next_call_restarts(
        sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", security_mode="permissive")
    assert _run(sessions, s.session_id, "kept = 'yes'").success
    # `platform.os`: the risk hint reads imports only; the sandbox is what holds the code
    crash = _run(sessions, s.session_id, "import platform\nprint('before', flush=True)\n"
                 "platform.os.system('echo child; echo child-err >&2')\nplatform.os._exit(3)")
    assert crash.exit_code == 3, crash
    assert not crash.success
    assert crash.stdout == "before\nchild\n"
    assert crash.stderr == "child-err\n"
    assert crash.interpreter is not None
    assert crash.interpreter["crashed"] == "crashed (exit code 3)"
    assert crash.interpreter["fresh"] is False  # the crash is this interpreter's, not a new one
    after = _run(sessions, s.session_id, "print('kept' in dir())")
    assert after.stdout == "False\n", after
    assert after.interpreter is not None
    assert "crashed (exit code 3)" in after.interpreter["state_lost"]
    killed = _run(sessions, s.session_id, "import platform\n"
                  "platform.os.kill(platform.os.getpid(), 9)")
    assert killed.interpreter is not None
    assert killed.interpreter["crashed"] == "crashed (signal 9)", killed


def test_restart_on_request_and_a_profile_change_restart_the_interpreter(
        env: tuple[Sessions, OrchestratorPool, Path]) -> None:
    sessions, pool, policy = env
    s = sessions.create("acme", "alice", security_mode="permissive")
    assert _run(sessions, s.session_id, "v = 1").success
    done = sessions.restart_interpreter("acme", "alice", s.session_id)
    assert done["killed"] is True
    fresh = _run(sessions, s.session_id, "print('v' in dir())\nv = 2")
    assert fresh.stdout == "False\n"
    assert fresh.interpreter is not None
    assert fresh.interpreter["state_lost"] == "restarted on request"
    assert _run(sessions, s.session_id, "print(v)").stdout == "2\n"
    # a reload narrowing the permitting rule's limits: the old process would run unlimited
    policy.write_text(POLICY.format(ws=sessions.root,
                                    limits="limits { memory 256MiB pids 64 }"))
    pool.swap(compile_files([policy]))
    moved = _run(sessions, s.session_id, "print('v' in dir())")
    assert moved.stdout == "False\n", moved
    assert moved.interpreter is not None
    assert "profile changed" in moved.interpreter["state_lost"]
    assert moved.interpreter["generation"] == 3
    # and the new interpreter runs under the new limits: its cgroup's memory.max
    caps = set()
    for pid in _interpreters(sessions):
        for group in _cgroups(pid):
            for name in ("memory.max", "memory.limit_in_bytes"):
                with contextlib.suppress(OSError):
                    caps.add((group / name).read_text().strip())
    assert str(256 << 20) in caps, caps


def test_a_denied_call_never_reaches_the_interpreter(sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", security_mode="permissive")
    assert _run(sessions, s.session_id, "x = 1").success
    denied = _run(sessions, s.session_id, "x = 2  # FORBIDDEN\nprint('ran')")
    assert not denied.success
    assert denied.refusal is not None
    assert denied.refusal["rule"]["id"] == "no-marked-code", denied.refusal
    assert denied.interpreter is None
    assert "ran" not in denied.stdout
    rec = _evidence(sessions)[denied.exec_id]
    assert rec["end"]["decision"] == "deny"
    after = _run(sessions, s.session_id, "print(x)")
    assert after.stdout == "1\n", after
    assert after.interpreter == {"generation": 1, "fresh": False, "state_lost": None}


def test_an_exec_streams_and_its_cancel_kills_the_interpreter(sessions: Sessions) -> None:
    execs = SessionExecs(sessions)
    s = sessions.create("acme", "alice", security_mode="permissive")
    before = _interpreters(sessions)
    assert _run(sessions, s.session_id, "y = 5").success
    job = execs.start("acme", "alice", s.session_id,
                      "import time\nfor i in range(100):\n    print('tick', i, flush=True)\n"
                      "    time.sleep(0.1)", timeout=60, wait=False, stateful=True)
    deadline = time.monotonic() + 20
    while not any("tick 1" in c.text for c in list(job.chunks)):
        assert time.monotonic() < deadline, "streamed output while the call runs"
        time.sleep(0.02)
    live = _interpreters(sessions) - before
    assert live
    done = execs.cancel("acme", "alice", s.session_id, job.exec_id)
    assert done.status == "cancelled"
    assert done.result is not None
    assert not live & _interpreters(sessions), "the cancelled interpreter is gone"
    rec = _evidence(sessions)[done.result.exec_id]
    assert set(rec) == {"begin", "end"}
    assert rec["end"]["status"] == "error"
    after = _run(sessions, s.session_id, "print('y' in dir())")
    assert after.stdout == "False\n"
    assert after.interpreter is not None
    assert "cancelled" in after.interpreter["state_lost"]


def test_nothing_of_the_interpreter_survives_the_session(sessions: Sessions) -> None:
    before = _interpreters(sessions)
    s = sessions.create("acme", "alice", security_mode="permissive")
    assert _run(sessions, s.session_id, "import platform\n"
                "platform.os.system('sleep 300 &')\nz = 1").success
    mine = _interpreters(sessions) - before
    assert mine
    groups = {g for pid in mine for g in _cgroups(pid)}
    assert groups, "the interpreter runs in its own cgroup"
    procs = {int(x) for g in groups for x in (g / "cgroup.procs").read_text().split()}
    assert len(procs) > len(mine), "the backgrounded sleeper is in the interpreter's cgroup"
    ended = sessions.delete("acme", "alice", s.session_id)
    assert ended["interpreter_killed"], ended
    assert not mine & _interpreters(sessions)
    for pid in procs:  # every process of its cgroup is gone (the sleeper too)
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid
    for g in groups:  # and the group is emptied (released to the pool, or removed)
        if (g / "cgroup.procs").exists():
            assert (g / "cgroup.procs").read_text().strip() == "", g
    events = [e["event"] for e in sessions.events("acme", "alice", s.session_id)]
    assert events[-2:] == ["interpreter_ended", "ended"]


def test_ttl_expiry_ends_the_interpreter(sessions: Sessions) -> None:
    before = _interpreters(sessions)
    s = sessions.create("acme", "alice", ttl_s=1, security_mode="permissive")
    assert _run(sessions, s.session_id, "w = 1").success
    mine = _interpreters(sessions) - before
    assert mine
    deadline = time.monotonic() + 10
    while mine & _interpreters(sessions):
        assert time.monotonic() < deadline, "the reaper ended the expired session's interpreter"
        time.sleep(0.1)
    # the interpreter can be gone (killed, reaped) a moment before the reaper has written the
    # session's last events: wait for them, within the same deadline
    while sessions.events("acme", "alice", s.session_id)[-1]["event"] != "ended" \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = sessions.events("acme", "alice", s.session_id)[-1]
    assert ended["event"] == "ended"
    assert ended["detail"]["reason"] == "expired"
    assert ended["detail"]["interpreter_killed"]


def test_concurrent_stateful_calls_take_turns(sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", security_mode="permissive")
    assert _run(sessions, s.session_id, "n = 0").success
    results: list[RunCodeResult] = []
    threads = [threading.Thread(target=lambda: results.append(
        _run(sessions, s.session_id, "m = n\nimport time\ntime.sleep(0.05)\nn = m + 1")))
        for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r.success for r in results), results
    assert _run(sessions, s.session_id, "print(n)").stdout == "3\n"


def test_a_stale_end_frame_from_a_background_thread_cannot_end_the_next_call(
        sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", security_mode="permissive")
    # the code owns the interpreter: here a thread writes a forged `D` frame on the protocol
    # socket (fd 0 was duplicated to the lowest free fd, 3 or above) after its call ended
    forged = _run(sessions, s.session_id, "import platform, struct\n"
                  "def forge():\n"
                  "    import time\n"
                  "    time.sleep(0.3)\n"
                  "    body = b'{\"ok\": true, \"error\": null}'\n"
                  "    for fd in range(3, 8):\n"
                  "        try:\n"
                  "            platform.os.write(fd, b'D' + struct.pack('>I', len(body)) + body)\n"
                  "        except OSError:\n"
                  "            pass\n"
                  "    open('forged', 'w').close()\n"
                  "import _thread\n_thread.start_new_thread(forge, ())")
    assert forged.success, forged
    deadline = time.monotonic() + 15
    while not (sessions.workspace(s) / "forged").exists():  # the stale frame is on the socket
        assert time.monotonic() < deadline
        time.sleep(0.05)
    real = _run(sessions, s.session_id, "import time\ntime.sleep(0.2)\nprint('ran to the end')")
    assert real.stdout == "ran to the end\n", real


def test_the_interpreter_over_http(tmp_path: Path) -> None:
    """The real server: the `interpreter` note, the restart route (owner only), and the
    session's delete answering the killed interpreter."""
    from tests.integration.service_server import add_token, serving

    with serving(tmp_path, "--security-mode", "permissive") as svc:
        alice = add_token(svc.state, "acme", "agent:alice")
        bob = add_token(svc.state, "acme", "agent:bob")
        with svc.client(alice) as c, svc.client(bob) as b:
            sid = c.post("/v1/sessions", json={"backend": "proc-bwrap"}).json()["session_id"]
            url = f"/v1/sessions/{sid}"
            first = c.post(f"{url}/run_code", json={"code": "q = 3", "stateful": True}).json()
            assert first["interpreter"] == {"generation": 1, "fresh": True,
                                            "state_lost": None, "crashed": None}, first
            assert b.post(f"{url}/interpreter/restart").status_code == 404
            again = c.post(f"{url}/run_code", json={"code": "print(q)", "stateful": True})
            assert again.json()["stdout"] == "3\n"
            restarted = c.post(f"{url}/interpreter/restart").json()
            assert restarted["killed"] is True
            assert restarted["reason"] == "restarted on request"
            lost = c.post(f"{url}/run_code", json={"code": "q = 4", "stateful": True}).json()
            assert lost["interpreter"]["state_lost"] == "restarted on request", lost
            plain = c.post(f"{url}/run_code", json={"code": "print(1)"}).json()
            assert plain["interpreter"] is None
            slow = c.post(f"{url}/execs", json={"code": "import time\ntime.sleep(60)",
                                                "stateful": True, "wait": False}).json()
            time.sleep(0.5)
            cancelled = c.delete(f"{url}/execs/{slow['exec_id']}").json()
            assert cancelled["status"] == "cancelled", cancelled
            assert cancelled["result"]["exec_id"]
            after = c.post(f"{url}/run_code", json={"code": "print('q' in dir())",
                                                    "stateful": True}).json()
            assert after["stdout"] == "False\n", after
            assert "cancelled" in after["interpreter"]["state_lost"], after
            ended = c.delete(url).json()
            assert ended["interpreter_killed"], ended
            events = [e["event"] for e in c.get(f"{url}/events").json()["events"]]
            assert events.count("interpreter_started") == 3
            assert events[-1] == "ended"


def test_a_malformed_frame_kills_the_interpreter_as_a_crash(sessions: Sessions) -> None:
    s = sessions.create("acme", "alice", security_mode="permissive")
    assert _run(sessions, s.session_id, "kept = 1").success
    # this session's interpreter only: other tests (other xdist workers) run theirs beside it
    work = str(sessions.workspace(s))
    before = {p for p in _interpreters(sessions) if _cwd(p).startswith(work)}
    assert before, "the session's interpreter is running"
    # a header announcing 1 GiB: the engine never reads that far, it kills the interpreter
    broken = _run(sessions, s.session_id, "import platform, struct\n"
                  "for fd in range(3, 8):\n"
                  "    try:\n"
                  "        platform.os.write(fd, b'D' + struct.pack('>I', 1 << 30))\n"
                  "    except OSError:\n"
                  "        pass\n"
                  "import time\ntime.sleep(30)", timeout=20)
    assert broken.error_code == "TOOL.EXECUTION_FAILED", broken
    assert "malformed frame" in (broken.error or "")
    assert not before & _interpreters(sessions)
    after = _run(sessions, s.session_id, "print('kept' in dir())")
    assert after.stdout == "False\n"
    assert after.interpreter is not None
    assert "frame protocol" in after.interpreter["state_lost"]


def test_the_profile_memory_limit_holds_the_interpreter(
        env: tuple[Sessions, OrchestratorPool, Path]) -> None:
    sessions, pool, policy = env
    policy.write_text(POLICY.format(ws=sessions.root, limits="limits { memory 128MiB }"))
    pool.swap(compile_files([policy]))
    s = sessions.create("acme", "alice", security_mode="permissive")
    assert _run(sessions, s.session_id, "keep = [1]").success
    grown = _run(sessions, s.session_id, "keep.append(bytearray(400 << 20))\nprint('no')")
    assert grown.error_code == "QUOTA.BUDGET_EXCEEDED", grown
    assert "state is lost" in (grown.error or "")
    assert "no" not in grown.stdout
    after = _run(sessions, s.session_id, "print('keep' in dir())")
    assert after.stdout == "False\n", after
    assert after.interpreter is not None
    assert "out-of-memory" in after.interpreter["state_lost"]
