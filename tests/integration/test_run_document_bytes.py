"""The `/v1/ops` answer rendered straight to bytes (``Called.to_json_bytes``: the end record's
bytes as the sinks wrote them, the decision rendered once per decision object) is the run
document ``Called.to_json`` builds, member for member, for a call that ran, one the policy
denied and one refused before any rule (issue 27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policy_engine.evidence.verify import read_jsonl
from policy_engine.gateway.call import Call
from policy_engine.model import FsReadOp, Grant, Settings
from policy_engine.service.app import open_engine
from tests.integration.service_server import grant
from tests.integration.test_service_fastpath import _config

pytestmark = pytest.mark.integration


def test_the_answer_bytes_are_the_run_document(tmp_path: Path) -> None:
    config = _config(tmp_path, tmp_path / "state", 10**6)
    engine = open_engine(config)
    try:
        manifest = config.manifests["reader"]
        settings = Settings(root_fs=str(tmp_path))
        (tmp_path / "data" / "secret" / "k.txt").write_text("k\n")
        cases = [("ok", f"{tmp_path}/data/hello.txt", {}),
                 ("denied", f"{tmp_path}/data/secret/k.txt", {}),  # the forbid rule
                 ("expired", f"{tmp_path}/data/hello.txt", {"expires_at": 1})]
        for i, (name, path, extra) in enumerate(cases * 2):  # twice: the remembered decision
            g = Grant.model_validate(grant("acme", "agent:alice", tmp_path,
                                           call_id=f"c-{i}", **extra))
            called = engine.gateway.run(Call(g, manifest, FsReadOp(kind="fs.read", path=path),
                                             settings=settings))
            assert called.ok is (name == "ok")
            error = {"code": "X", "retryable": False}
            for after in ({}, {"error": error}):
                got = called.to_json_bytes(**after)
                doc = json.loads(got)
                assert doc == {**called.to_json(), **after}, name
                assert list(doc) == [*called.to_json(), *after]  # the same member order
            # the evidence member is byte for byte the end record the log holds (its chain
            # link aside)
            end = called.outcome.end.json_bytes()
            assert b',"evidence":' + end in got
            lines = read_jsonl(config.engine.state_dir / "evidence" / "evidence.jsonl")
            assert lines[-1].startswith(end[:-1] + b',"chain":')
            assert sum(b'"type":"end"' in line for line in lines) == i + 1
    finally:
        engine.close()
