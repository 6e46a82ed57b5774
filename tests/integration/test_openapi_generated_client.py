"""A client generated from docs/openapi.json by a real generator (openapi-python-client) calls
a refused op on the real server and reads its refusal and evidence id (issue 28 item 6)."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.service_server import Service, add_token, grant, serving

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("gen")) as service:
        yield service


def test_a_generated_client_reads_a_denials_evidence(svc: Service, tmp_path: Path) -> None:
    tool = shutil.which("openapi-python-client")
    assert tool is not None, "pip install '.[dev]' (openapi-python-client)"
    out = tmp_path / "pe_generated"
    made = subprocess.run([tool, "generate", "--path", str(DOC), "--output-path", str(out),
                           "--meta", "none"], capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        client_mod = importlib.import_module("pe_generated.client")
        run_op = importlib.import_module("pe_generated.api.decisions.run_op_v1_ops_post")
        models = importlib.import_module("pe_generated.models")
        token = add_token(svc.state, "acme", "agent:alice")
        root = svc.root
        body = models.CallBody.from_dict({
            "op": {"kind": "fs.read", "path": f"{root}/data/secret/key.txt"},
            "grant": grant("acme", "agent:alice", root), "manifest": "reader"})
        client = client_mod.AuthenticatedClient(base_url=svc.url, token=token)
        with client:
            resp = run_op.sync_detailed(client=client, body=body)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("pe_generated")]:
            del sys.modules[name]
    assert resp.status_code == 403
    parsed = resp.parsed
    assert type(parsed).__name__ == "OpDocument", parsed  # not ErrorBody: evidence kept
    assert parsed.refusal.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert parsed.refusal.envelope_id == parsed.envelope_id
    assert parsed.result.ok is False
    evidence = "\n".join(p.read_text() for p in svc.state.rglob("*.jsonl"))
    assert parsed.envelope_id in evidence
