"""Issue 32 item 10: the default install signs checkpoints. With no evidence option set, the
first start creates an Ed25519 key beside the evidence (0600, and its public half), the sinks
sign a checkpoint every ``checkpoint_every`` records and at shutdown, and `evidence verify
--public-key` catches an edit of the last record and a cut tail; ``signing_key: false`` keeps
the keyless mode. Real orchestrator calls through the real plugin hooks; tampering is done on
the stored bytes."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.config import EngineConfig
from policy_engine.model import TmpAllocOp
from policy_engine.orchestrator import Orchestrator
from tests.unit.test_hot_reload import GRANT, LIMITS, MANIFEST, A


def calls(tmp: Path, n: int, **config: object) -> Path:
    """``n`` real calls through an orchestrator of ``config``; returns the state dir."""
    (tmp / "limits.sbpolicy").write_text(LIMITS)
    (tmp / "p.sbpolicy").write_text(A)
    (tmp / "g.json").write_text(json.dumps(GRANT))
    (tmp / "m.json").write_text(json.dumps(MANIFEST))
    state = tmp / "state"
    orch = Orchestrator(compile_files([tmp / "p.sbpolicy"]),
                        config=EngineConfig(state_dir=state, budget_meter="memory",
                                            revocation="memory", **config))  # type: ignore[arg-type]
    grant, manifest = load_grant(tmp / "g.json"), load_manifest(tmp / "m.json")
    with orch:
        for _ in range(n):
            assert orch.run(grant, manifest, TmpAllocOp(size_bytes=64)).result.ok
    return state


def verify(log: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["evidence", "verify", str(log), *extra])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_the_default_install_signs_and_a_verifier_with_the_key_catches_the_tail(
        tmp_path: Path) -> None:
    state = calls(tmp_path, 3)
    key = state / "evidence" / "evidence-signing.pem"
    pub = state / "evidence" / "evidence-signing.pem.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    log = state / "evidence" / "evidence.jsonl"
    rows = log.read_bytes().splitlines()
    assert json.loads(rows[-1])["type"] == "checkpoint"  # signed at shutdown
    assert verify(log, "--public-key", str(pub))[0] == 0

    # an edit of the last record (its line re-chained into the checkpoint would still need
    # the key): the chain names it, and the signed head does
    last = json.loads(rows[-2])
    last["status"] = "denied"
    edited = [*rows[:-2], json.dumps(last, separators=(",", ":")).encode(), rows[-1]]
    log.write_bytes(b"".join(r + b"\n" for r in edited))
    code, out = verify(log, "--public-key", str(pub))
    assert code == 1, out
    # a cut tail (the last call and the closing checkpoint dropped): not covered by a signature
    log.write_bytes(b"".join(r + b"\n" for r in rows[:-3]))
    code, out = verify(log, "--public-key", str(pub))
    assert code == 1, out
    assert "protected by the chain only" in out
    # a live log's unsigned tail is accepted only when asked
    code, out = verify(log, "--public-key", str(pub), "--allow-unsigned-tail")
    assert code == 0, out


def test_a_checkpoint_every_n_records_and_one_key_across_restarts(tmp_path: Path) -> None:
    state = calls(tmp_path, 4, options={"evidence_jsonl": {"checkpoint_every": 3}})
    key = state / "evidence" / "evidence-signing.pem"
    first = key.read_bytes()
    log = state / "evidence" / "evidence.jsonl"
    kinds = [json.loads(r)["type"] for r in log.read_bytes().splitlines()]
    assert kinds.count("checkpoint") >= 3  # every 3 chained records, and at shutdown
    assert kinds[-1] == "checkpoint"
    calls(tmp_path, 1)  # a second start reuses the key
    assert key.read_bytes() == first
    pub = state / "evidence" / "evidence-signing.pem.pub"
    assert verify(log, "--public-key", str(pub))[0] == 0


def test_sqlite_signs_by_default_too(tmp_path: Path) -> None:
    state = calls(tmp_path, 2, evidence_sinks=["sqlite"])
    db = state / "evidence" / "evidence.sqlite"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM evidence_checkpoints").fetchone()[0] == 1
    pub = state / "evidence" / "evidence-signing.pem.pub"
    assert verify(db, "--public-key", str(pub))[0] == 0


def test_signing_key_false_keeps_the_keyless_mode(tmp_path: Path) -> None:
    state = calls(tmp_path, 2, options={"evidence_jsonl": {"signing_key": False}})
    assert not (state / "evidence" / "evidence-signing.pem").exists()
    log = state / "evidence" / "evidence.jsonl"
    kinds = [json.loads(r)["type"] for r in log.read_bytes().splitlines()]
    assert "checkpoint" not in kinds
    code, out = verify(log)
    assert code == 0, out


def test_a_default_key_others_can_read_is_refused(tmp_path: Path) -> None:
    calls(tmp_path, 1)
    key = tmp_path / "state" / "evidence" / "evidence-signing.pem"
    os.chmod(key, 0o644)
    with pytest.raises(ValueError, match="0600"):
        calls(tmp_path, 1)
