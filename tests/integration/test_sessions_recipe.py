"""docs/sessions.md's recipe, run as written: its policy is lint-clean and, served, runs
run_code (stateful), files, a streamed shell exec and a skill through the client, on
proc-bwrap and on Docker sessions. The policy names no host path: its `$SESSION/**` is each
session's own workspace, resolved by the engine per call; one session cannot reach another's
files, and a call outside a session (plain `/v1/ops`) gets nothing under it (explain says
why)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.client import Client, PolicyRefusal
from tests.integration.service_server import add_token, start

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "sessions.md"
SKILLS = Path(__file__).resolve().parents[2] / "skills"


def _policy() -> str:
    found = re.search(r"```sbpolicy\n(.*?)```", DOC.read_text(), re.S)
    assert found is not None
    return found.group(1)


def test_the_recipe_policy_is_lint_clean(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sbpolicy"
    path.write_text(_policy())
    out = subprocess.run([sys.executable, "-m", "policy_engine.cli", "lint", str(path)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 error(s), 0 warning(s)" in out.stdout
    assert "2 suppressed" in out.stdout


@pytest.mark.parametrize("backend", ["proc-bwrap", "docker"])
def test_the_recipe_runs(tmp_path: Path, backend: str) -> None:
    text = _policy().replace("{", "{{").replace("}", "}}")
    assert "/srv" not in text  # nothing to replace: the policy names no host path
    # docs/sessions.md step 2: Docker sessions keep their live interpreter in their own warm
    # container (the executor's pool mode; run-once refuses stateful calls)
    config = tmp_path / "engine.yaml"
    config.write_text("options:\n  docker: {mode: pool, pool_size: 1}\n")
    with start(tmp_path, "--security-mode", "permissive", "--config", str(config),
               "--skills", str(SKILLS), policy_text=text) as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        with Client(svc.url, token) as c:
            s = c.create_session(backend=backend, ttl_s=900)
            c.upload(s.session_id, "data/in.csv", b"a,b\n1,2\n")
            loaded = c.run_code(s.session_id, "import csv\n"
                                "rows = list(csv.reader(open('data/in.csv')))", stateful=True)
            assert loaded.success, loaded
            counted = c.run_code(s.session_id, "print(len(rows))", stateful=True)
            assert counted.stdout == "2\n", counted
            assert counted.sandbox_type == backend, counted
            job = c.start_exec(s.session_id, "for i in 1 2 3; do echo $i; done", "shell")
            events = list(c.stream_exec(s.session_id, job.exec_id))
            final = events[-1].final
            assert final is not None
            assert final.status == "completed"
            assert final.result is not None
            assert final.result.stdout == "1\n2\n3\n", final
            # streamed as written, on both backends
            assert "".join(e.text for e in events if e.event == "stdout") == "1\n2\n3\n", final
            c.run_code(s.session_id, "open('out.txt', 'w').write('done')")
            assert c.download(s.session_id, "out.txt") == b"done"
            # a skill in the session reads what its code wrote (`work/` = its workspace)
            read = c.invoke_skill(s.session_id, "files.read", {"path": "work/out.txt"})
            assert read.ok, read
            assert base64.b64decode(read.output["bytes_b64"]) == b"done"
            assert read.output["size"] == 4
            wrote = c.run_code(s.session_id, "pwd", language="shell")
            assert wrote.success, wrote
            # another session of the same owner, on the same backend: the first one's files
            # are out of reach by absolute path (the code) and by relative escape (files API)
            other = c.create_session(backend=backend, ttl_s=900)
            mine = f"{wrote.stdout.strip()}/out.txt"
            peek = c.run_code(other.session_id, f"cat {mine}", language="shell")
            assert not peek.success, peek
            assert "done" not in peek.stdout, peek
            with pytest.raises(PolicyRefusal):
                c.download(other.session_id, f"../../{s.session_id}/work/out.txt")
            with pytest.raises(PolicyRefusal) as escaped:  # nor through a skill
                c.invoke_skill(other.session_id, "files.read",
                               {"path": f"work/../../{s.session_id}/work/out.txt"})
            assert escaped.value.refusal.refused_by == "policy"
            for sid in (s.session_id, other.session_id):
                assert c.delete_session(sid)["workspace_removed"] is True


def test_outside_a_session_the_recipe_grants_nothing(tmp_path: Path) -> None:
    """A plain `/v1/ops` call under the recipe policy: `$SESSION` is unresolved, so the
    files rule matches nothing (fail closed) even for a grant naming a session's directory;
    `/v1/decide?explain=full` says why, and answers as the run."""
    text = _policy().replace("{", "{{").replace("}", "}}")
    # docs/sessions.md step 2: Docker sessions keep their live interpreter in their own warm
    # container (the executor's pool mode; run-once refuses stateful calls)
    config = tmp_path / "engine.yaml"
    config.write_text("options:\n  docker: {mode: pool, pool_size: 1}\n")
    with start(tmp_path, "--security-mode", "permissive", "--config", str(config),
               policy_text=text) as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        with Client(svc.url, token) as c:
            s = c.create_session(backend="proc-bwrap", ttl_s=900)
            c.upload(s.session_id, "in.txt", b"kept")
            where = c.run_code(s.session_id, "pwd", language="shell").stdout.strip()
        caps = [{"kind": "fs.read", "paths": [f"{where}/**"]}]
        body = {"op": {"kind": "fs.read", "path": f"{where}/in.txt"}, "manifest": "reader",
                "grant": {"tenant": "acme", "subject_id": "agent:alice", "tool_name": "reader",
                          "call_id": "c1", "expires_at": 4102444800000, "capabilities": caps}}
        with svc.client(token) as http:
            said = http.post("/v1/decide?explain=full", json=body).json()
            ran = http.post("/v1/ops", json=body).json()
        assert said["decision"] == "deny", said
        notes = [t for t in said["trace"] if t["node"] == "variables"]
        assert len(notes) == 1, said["trace"]
        assert "not in a session" in notes[0]["detail"], notes
        assert notes[0]["rule"]["id"].endswith("session-files"), notes
        assert ran["decision"]["decision"] == "deny", ran
        assert ran["decision"]["reason"] == said["reason"], (ran, said)
        assert "kept" not in str(ran)
