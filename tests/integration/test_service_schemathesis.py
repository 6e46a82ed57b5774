"""schemathesis drives every operation of the committed OpenAPI document against the real
server: no response is a 5xx, and every response matches the documented schema."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.service_server import POLICY, add_token, start

pytestmark = pytest.mark.integration

# every exec of the fuzzed server ends within 5 s, below schemathesis's 10 s wait: a generated
# `cpu_cores: 0.01` (the smallest a limit may say) makes `bash -lc ""` take half a minute
FUZZ_POLICY = POLICY.replace('tool "bash"', 'tool "bash"  limits {{ timeout 5s }}').replace(
    'tool "python3"', 'tool "python3"  limits {{ timeout 5s }}')


def test_no_server_errors_and_conforming_responses(tmp_path: Path) -> None:
    st = shutil.which("schemathesis") or shutil.which("st")
    assert st is not None, "schemathesis is a test dependency (pip install -e '.[test]')"
    with start(tmp_path, "--rate-per-minute", "1000000", policy_text=FUZZ_POLICY) as svc:
        token = add_token(svc.state, "acme", "agent:fuzz")
        done = subprocess.run(
            [st, "run", f"{svc.url}/openapi.json", "-H", f"Authorization: Bearer {token}",
             "--checks", "not_a_server_error,status_code_conformance,"
             "content_type_conformance,response_schema_conformance",
             "--max-examples", "10", "--seed", "1", "--no-color",
             # run_code turns most generated code into a container run (seconds each); its
             # HTTP surface is driven in test_service_http.py
             "--exclude-path", "/v1/run_code"],
            capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path)
        log = svc.stop()
    assert done.returncode == 0, done.stdout[-6000:]
    assert "Traceback" not in log, log[-4000:]


def test_skill_invocations_conform_to_the_served_document(tmp_path: Path) -> None:
    """With skills served, a body the document calls valid is accepted (ST202, fuzz round 2:
    `{}` to `POST /skills/docs.browse/invoke` was documented valid and answered 422)."""
    st = shutil.which("schemathesis") or shutil.which("st")
    assert st is not None, "schemathesis is a test dependency (pip install -e '.[test]')"
    skills = Path(__file__).resolve().parents[2] / "skills"
    with start(tmp_path, "--rate-per-minute", "1000000", "--skills", str(skills)) as svc:
        token = add_token(svc.state, "acme", "agent:fuzz")
        done = subprocess.run(
            [st, "run", f"{svc.url}/openapi.json", "-H", f"Authorization: Bearer {token}",
             "--checks", "not_a_server_error,status_code_conformance,"
             "content_type_conformance,response_schema_conformance,positive_data_acceptance",
             "--include-path-regex", "^/skills",
             # the read-only skills: a shell or python skill would run generated code
             "--exclude-path-regex", "(shell|python)\\.run",
             "--max-examples", "10", "--seed", "1", "--no-color"],
            capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path)
        log = svc.stop()
    assert done.returncode == 0, done.stdout[-6000:]
    assert "Traceback" not in log, log[-4000:]
