"""A grant revoked by another process is refused at the server's very next call.

`policy-engine serve` (process A) keeps the revoked keys in memory and asks SQLite again only
when the list's shared generation moved (orchestration/revocation.py): these tests revoke from
process B through the API and through `SqliteRevocationList` on another connection, and hold A
to refusing the next call each time, with the revocation's code and both evidence records.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from policy_engine.evidence.verify import read_jsonl
from policy_engine.model import Grant
from policy_engine.orchestration.revocation import SqliteRevocationList
from tests.integration.service_server import Service, add_token, grant, serving

pytestmark = pytest.mark.integration

# process B: revokes each key read from stdin through the API, answers "ok" once it returned
_REVOKER = """
import sys
from pathlib import Path
from policy_engine.orchestration.revocation import SqliteRevocationList
revocations = SqliteRevocationList(Path(sys.argv[1]))
for line in sys.stdin:
    revocations.revoke(line.strip())
    print("ok", flush=True)
"""
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("revoked")) as service:
        yield service


@pytest.fixture(scope="module")
def token(svc: Service) -> str:
    return add_token(svc.state, "acme", "agent:alice")


def _read(svc: Service, token: str, call_id: str, **extra: object) -> httpx.Response:
    body = {"op": {"kind": "fs.read", "path": f"{svc.root}/data/hello.txt"},
            "grant": grant("acme", "agent:alice", svc.root, call_id=call_id, **extra),
            "manifest": "reader"}
    return httpx.post(f"{svc.url}/v1/ops", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {token}"})


def _assert_revoked(resp: httpx.Response) -> None:
    assert resp.status_code == 403, resp.text
    out = resp.json()
    assert out["error"]["code"] == "SANDBOX.PERMISSION_DENY", out
    assert out["error"]["message"] == "permission denied: grant revoked", out
    assert out["decision"]["decision"] == "deny", out


def test_each_revocation_from_another_process_refuses_the_next_call(svc: Service,
                                                                     token: str) -> None:
    revoker = subprocess.Popen(
        [sys.executable, "-c", _REVOKER, str(svc.state / "revocations.sqlite")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert revoker.stdin is not None
    assert revoker.stdout is not None
    try:
        for i in range(40):  # back to back: a missed generation would let one through
            call_id = f"back-to-back-{i}"
            assert _read(svc, token, call_id).status_code == 200
            assert _read(svc, token, f"other-{i}").status_code == 200
            revoker.stdin.write(call_id + "\n")
            revoker.stdin.flush()
            assert revoker.stdout.readline().strip() == "ok"
            refused = _read(svc, token, call_id)
            _assert_revoked(refused)
            # an unrelated grant still runs: the key, not the whole list, is refused
            assert _read(svc, token, f"still-live-{i}").status_code == 200
    finally:
        revoker.stdin.close()
        assert revoker.wait(timeout=30) == 0
    envelope = refused.json()["envelope_id"]
    records = [r for r in map(json.loads, read_jsonl(svc.state / "evidence" / "evidence.jsonl"))
               if r.get("envelope_id") == envelope]
    assert sorted(r["type"] for r in records) == ["begin", "end"], records


def test_a_revoked_decision_key_fingerprint_refuses_every_call_under_it(
        svc: Service, token: str) -> None:
    fingerprint = "fp-" + "ab" * 16
    assert _read(svc, token, "fp-call-1", decision_key_fingerprint=fingerprint
                 ).status_code == 200
    SqliteRevocationList(svc.state / "revocations.sqlite").revoke(fingerprint)
    for call_id in ("fp-call-1", "fp-call-2"):
        _assert_revoked(_read(svc, token, call_id, decision_key_fingerprint=fingerprint))


def test_two_lists_on_one_file_see_each_others_revocations_at_once(tmp_path: Path) -> None:
    """In one process, two lists each with their own connection and mapping (as two
    processes have)."""
    db = tmp_path / "revocations.sqlite"
    a, b = SqliteRevocationList(db), SqliteRevocationList(db)
    try:
        grants = [Grant.model_validate({**json.loads(json.dumps(grant(
            "acme", "agent:alice", tmp_path))), "call_id": f"c-{i}"}) for i in range(300)]
        for g in grants:
            assert not a.is_revoked(g)
            b.revoke(g.call_id)
            assert a.is_revoked(g)
            assert b.is_revoked(g)
        a.revoke("late")
        late = grants[0].model_copy(update={"call_id": "late"})
        assert b.is_revoked(late)
    finally:
        a.close()
        b.close()


def _grant(root: Path, call_id: str) -> Grant:
    return Grant.model_validate(grant("acme", "agent:alice", root, call_id=call_id))


def test_a_lost_counter_and_another_sqlite_client_are_seen(
        tmp_path: Path) -> None:
    """What moves no counter still reaches the next check: the counter's file removed, a
    row written by another SQLite client."""
    db = tmp_path / "revocations.sqlite"
    seen = SqliteRevocationList(db)
    try:
        assert not seen.is_revoked(_grant(tmp_path, "after-unlink"))
        db.with_name(db.name + ".generation").unlink()
        SqliteRevocationList(db).revoke("after-unlink")  # bumps a new counter file
        assert seen.is_revoked(_grant(tmp_path, "after-unlink"))

        assert not seen.is_revoked(_grant(tmp_path, "by-hand"))
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("INSERT INTO revocations VALUES ('by-hand', 1)")
        conn.close()
        assert seen.is_revoked(_grant(tmp_path, "by-hand"))
    finally:
        seen.close()


def _queries(revocations: SqliteRevocationList) -> list[str]:
    """The statements ``revocations``' connection runs from now on."""
    statements: list[str] = []
    conn = revocations._conn  # noqa: SLF001 — counting the queries is the point
    assert conn is not None
    conn.set_trace_callback(statements.append)
    return statements


def test_a_list_nobody_ever_revoked_from_is_answered_from_memory(tmp_path: Path) -> None:
    """A fresh state directory: the counter file exists but was never bumped. Its first
    reader starts it, so every later check of an unchanged list asks no query (it asked
    SQLite on every call: a `/v1/ops` call on a new install paid a query each time); a
    revocation from another list is still refused at the next check."""
    db = tmp_path / "revocations.sqlite"
    fresh = SqliteRevocationList(db)
    try:
        assert not fresh.is_revoked(_grant(tmp_path, "first"))
        statements = _queries(fresh)
        for i in range(20):
            assert not fresh.is_revoked(_grant(tmp_path, f"c-{i}"))
        assert statements == [], statements
        SqliteRevocationList(db).revoke("c-3")
        assert fresh.is_revoked(_grant(tmp_path, "c-3"))
        assert not fresh.is_revoked(_grant(tmp_path, "c-4"))
    finally:
        fresh.close()


def test_a_counter_cut_short_starts_again_where_no_reader_has_been(tmp_path: Path) -> None:
    """A counter truncated under a running reader (attack 36) and started again by a new
    list: the new value is one the reader never saw, so a revocation made meanwhile is read."""
    db = tmp_path / "revocations.sqlite"
    reader = SqliteRevocationList(db)
    try:
        assert not reader.is_revoked(_grant(tmp_path, "x"))
        counter = db.with_name(db.name + ".generation")
        for _ in range(5):
            os.truncate(counter, 0)
            writer = SqliteRevocationList(db)  # starts the counter again
            assert not reader.is_revoked(_grant(tmp_path, "x"))
            writer.revoke("x")
            writer.close()
            assert reader.is_revoked(_grant(tmp_path, "x"))
            conn = sqlite3.connect(db, isolation_level=None)
            conn.execute("DELETE FROM revocations WHERE key = 'x'")
            conn.close()
    finally:
        reader.close()
