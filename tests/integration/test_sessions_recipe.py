"""docs/sessions.md's recipe, run as written: its policy is lint-clean and, served, runs
run_code (stateful), files and a streamed shell exec through the client."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.client import Client
from tests.integration.service_server import add_token, start

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "sessions.md"


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


def test_the_recipe_runs(tmp_path: Path) -> None:
    text = _policy().replace("{", "{{").replace("}", "}}")
    text = text.replace("/srv/policy-engine/workspace", "{ws}")
    with start(tmp_path, "--security-mode", "permissive", policy_text=text) as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        with Client(svc.url, token) as c:
            s = c.create_session(backend="proc-bwrap", ttl_s=900)
            c.upload(s.session_id, "data/in.csv", b"a,b\n1,2\n")
            loaded = c.run_code(s.session_id, "import csv\n"
                                "rows = list(csv.reader(open('data/in.csv')))", stateful=True)
            assert loaded.success, loaded
            assert c.run_code(s.session_id, "print(len(rows))", stateful=True).stdout == "2\n"
            job = c.start_exec(s.session_id, "for i in 1 2 3; do echo $i; done", "shell")
            events = list(c.stream_exec(s.session_id, job.exec_id))
            final = events[-1].final
            assert final is not None
            assert final.status == "completed"
            assert "".join(e.text for e in events if e.event == "stdout") == "1\n2\n3\n", \
                final
            c.run_code(s.session_id, "open('out.txt', 'w').write('done')")
            assert c.download(s.session_id, "out.txt") == b"done"
            assert c.delete_session(s.session_id)["workspace_removed"] is True
