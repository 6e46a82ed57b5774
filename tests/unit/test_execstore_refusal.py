"""Exec records carry the refusal document; a store written before that column existed gains it
on open (its old records read back with ``refusal: null``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from policy_engine.refusal import ConsentSeen, Refusal
from policy_engine.service.execstore import _SCHEMA, ExecStore
from policy_engine.service.models import ExecRecord


def _record(exec_id: str, refusal: dict[str, object] | None) -> ExecRecord:
    return ExecRecord.model_validate({
        "exec_id": exec_id, "project_id": "p", "task_id": None, "conversation_id": None,
        "skill_id": None, "cmd": "python3", "args": ["-c", "print(1)"], "cwd": "/w",
        "env_keys": [], "policy_snapshot": {}, "status": "denied" if refusal else "ok",
        "exit_code": None, "error_code": None, "error_reason": None, "started_at": 1,
        "ended_at": 2, "duration_ms": 1.0, "artifacts_path": "/a", "stdout_truncated": False,
        "stderr_truncated": False, "envelope_id": "env-" + exec_id, "refusal": refusal})


def test_an_old_store_gains_the_refusal_column(tmp_path: Path) -> None:
    path = tmp_path / "service.sqlite"
    # the schema before the refusal column (and the artifacts_truncated one after it)
    old_schema = _SCHEMA.replace(
        ",\n  refusal          TEXT,\n  artifacts_truncated INTEGER NOT NULL DEFAULT 0\n", "\n")
    assert "refusal" not in old_schema
    assert "artifacts_truncated" not in old_schema
    with sqlite3.connect(path) as db:
        db.executescript(old_schema)
        db.execute("INSERT INTO sandbox_execs VALUES ('old', 'acme', 's', 'p', NULL, NULL, "
                   "NULL, 'bash', '[]', '/w', '[]', '{}', 'ok', 0, NULL, NULL, 1, 2, 1.0, "
                   "'/a', 0, 0, 'env-old', '[]')")
    store = ExecStore(path)
    refusal = Refusal("SANDBOX.PERMISSION_DENY", 403, False, "permission denied: consent "
                      "required", "consent", consent=ConsentSeen(True, "timed_out",
                                                                 "webhook:webhook", 5),
                      envelope_id="env-new").to_json()
    store.add("acme", "s", _record("new", refusal), [])
    got = store.get("acme", "new")
    assert got is not None
    assert got.refusal is not None
    assert got.refusal.model_dump() == refusal
    old = store.get("acme", "old")
    assert old is not None
    assert old.refusal is None
    store.close()
