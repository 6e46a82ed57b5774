"""A stateful call the session's backend cannot run is the backend's refusal (issue 28, left
open): ``refused_by: backend`` and no rule, like a refused backend selection.

Before: on a docker session in ``run-once`` mode (no warm container to keep an interpreter in)
``run_code(..., stateful=True)`` was refused with ``SANDBOX.CAPABILITY_BLOCKED`` and the right
message, but the refusal said ``refused_by: policy`` and named the rule that *allowed* the call
(``py``): an integrator reading it would look for a policy change that cannot help. The same
for the sync and async exec faces (their record carries the same document), over HTTP and in
Python. A plain call of the same session still runs, and a backend refusal from the selection
(network ``on`` on docker) was already ``backend``; both are kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.gateway.session_execs import SessionExecs
from policy_engine.gateway.session_runtime import Sessions
from tests.integration.service_server import Service, add_token, serving
from tests.integration.test_sessions_runtime import sessions_in

pytestmark = pytest.mark.integration

WHY = "docker keeps a live interpreter only for a session's calls in pool mode"


def assert_backend_refusal(refusal: dict[str, Any] | None, why: str = WHY) -> None:
    assert refusal is not None
    assert refusal["code"] == "SANDBOX.CAPABILITY_BLOCKED", refusal
    assert why in refusal["message"], refusal
    assert refusal["refused_by"] == "backend", refusal
    assert refusal["rule"] is None, refusal
    assert refusal["envelope_id"], refusal  # recorded: begin + end


def _evidence_end(state: Path, envelope: str) -> dict[str, Any]:
    for path in state.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "end" and rec.get("envelope_id") == envelope:
                return dict(rec)
    raise AssertionError(f"no evidence end for {envelope}")


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # the default docker mode is `run-once`: no session container to keep an interpreter in
    with serving(tmp_path_factory.mktemp("backend-refusal"), "--security-mode",
                 "permissive") as service:
        yield service


def test_stateful_run_code_on_a_run_once_docker_session_over_http(svc: Service) -> None:
    token = add_token(svc.state, "acme", "agent:stateful")
    with svc.client(token) as c:
        made = c.post("/v1/sessions", json={"backend": "docker"})
        assert made.status_code == 201, made.text
        sid = made.json()["session_id"]
        ran = c.post(f"/v1/sessions/{sid}/run_code",
                     json={"code": "x = 1", "stateful": True, "timeout_s": 60}).json()
        assert not ran["success"], ran
        assert_backend_refusal(ran["refusal"])
        end = _evidence_end(svc.state, ran["refusal"]["envelope_id"])
        assert end["sandbox_error_kind"] == "capability", end
        # the sync and async exec faces carry the same document in their record
        for wait in (True, False):
            job = c.post(f"/v1/sessions/{sid}/execs",
                         json={"code": "y = 2", "stateful": True, "wait": wait,
                               "timeout_s": 60}).json()
            deadline = time.monotonic() + 60
            while job["status"] not in ("completed", "cancelled"):
                assert time.monotonic() < deadline, job
                time.sleep(0.05)
                job = c.get(f"/v1/sessions/{sid}/execs/{job['exec_id']}").json()
            assert job["status"] == "completed", job
            assert not job["result"]["success"], job
            assert_backend_refusal(job["result"]["refusal"])
        # a plain call of the same session runs: only the stateful one was the backend's no
        plain = c.post(f"/v1/sessions/{sid}/run_code",
                       json={"code": "print(6 * 7)", "timeout_s": 60}).json()
        assert plain["success"], plain
        assert plain["stdout"].strip() == "42"
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200


@pytest.fixture
def run_once(tmp_path: Path) -> Iterator[Sessions]:
    with sessions_in(tmp_path) as made:  # docker `run-once`
        yield made


def test_stateful_run_code_on_a_run_once_docker_session_in_python(run_once: Sessions) -> None:
    info = run_once.create("acme", "alice", backend="docker")
    res = run_once.run_code("acme", "alice", info.session_id, "x = 1", stateful=True,
                            timeout=60)
    assert not res.success
    assert_backend_refusal(res.refusal)
    job = SessionExecs(run_once).start("acme", "alice", info.session_id, "x = 1", "python",
                                       60, wait=True, stateful=True)
    assert job.result is not None
    assert_backend_refusal(job.result.refusal)
    run_once.delete("acme", "alice", info.session_id)


EXEC_POLICY = """policy "backend/exec" version "1.0.0"
permit "sh" proc.exec tool "true"
permit "out" fs.read, fs.write paths ["{out}/**"]
require consent when `false`
"""


def test_an_exec_the_backend_refuses_at_run_time_names_the_backend(tmp_path: Path) -> None:
    """A proc.exec whose writable bind would hold the engine's launcher cache: proc-bwrap
    refuses it whatever the policy permits (outsider round 3 F7), after the guard allowed it.
    Before: ``refused by: policy`` naming the rule ``out``. Through the real CLI."""
    out = tmp_path / "out"
    (out / "cache").mkdir(parents=True)
    (tmp_path / "p.sbpolicy").write_text(EXEC_POLICY.format(out=out))
    perms = [{"kind": "proc.exec", "tool": "true"},
             {"kind": "fs.write", "paths": [f"{out}/**"]}]
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "t", "version": "1.0.0", "permissions": perms, "side_effects": ["Process"],
        "safety_class": "Low"}))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:x", "tool_name": "t", "call_id": "c1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 10}}))
    (tmp_path / "req.json").write_text(json.dumps({
        "op": {"kind": "proc.exec", "tool": "true", "cwd": str(out)},
        "settings": {"root_fs": str(tmp_path)}}))
    config = tmp_path / "engine.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nbackends: {{proc.exec: proc-bwrap}}\n"
                      f"options: {{proc: {{launcher_cache: {out / 'cache'}, prespawn: 0}}}}\n")
    ran = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--format", "json", "--config",
         str(config), "--policy", str(tmp_path / "p.sbpolicy"), "--manifest",
         str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"), "--request",
         str(tmp_path / "req.json")], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    doc = json.loads(ran.stdout)
    assert doc["decision"]["decision"] == "allow", doc  # the guard's yes, recorded as such
    assert_backend_refusal(doc["refusal"], "the engine's native launcher cache")
    assert doc["evidence"]["sandbox_error_kind"] == "capability", doc["evidence"]
