"""Attack 36: the in-memory revocation cache against its counter file and its database.

Each test runs a real `policy-engine serve` on loopback and changes the state directory from
outside it, as a careless operator or another SQLite client would (docs/operations.md,
"Budgets and revocation": a revocation made by any process is refused at the next call; a row
written by another SQLite client is seen).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.service_server import Service, add_token, grant, serving

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
_REVOKE = ("import sys; from pathlib import Path; "
           "from policy_engine.orchestration.revocation import SqliteRevocationList as L; "
           "[L(Path(sys.argv[1])).revoke(k) for k in sys.argv[2:]]")


def _revoke_elsewhere(svc: Service, *keys: str) -> None:
    """Revoke from another process through the documented API."""
    done = subprocess.run([sys.executable, "-c", _REVOKE, str(svc.state / "revocations.sqlite"),
                           *keys], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stderr


def _read(svc: Service, token: str, call_id: str) -> httpx.Response:
    body = {"op": {"kind": "fs.read", "path": f"{svc.root}/data/hello.txt"},
            "grant": grant("acme", "agent:alice", svc.root, call_id=call_id),
            "manifest": "reader"}
    return httpx.post(f"{svc.url}/v1/ops", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {token}"})


def _assert_revoked(resp: httpx.Response) -> None:
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["message"] == "permission denied: grant revoked", resp.text


@pytest.mark.parametrize("mapped", ["revocations.sqlite.generation", "budget.meter",
                                    "budget.rate"])
def test_a_truncated_mapped_file_does_not_kill_the_server(tmp_path: Path, mapped: str) -> None:
    """`: > STATE/FILE` (or a restore with `cp`) of a file every engine process maps must not
    crash `serve`: reading a mapping past a truncated file's end is SIGBUS."""
    with serving(tmp_path) as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        assert _read(svc, token, "before").status_code == 200
        os.truncate(svc.state / mapped, 0)
        try:
            after = _read(svc, token, "after-truncate")
        except httpx.TransportError as exc:
            pytest.fail(f"server died (exit {svc.proc.wait(timeout=10)}): {exc!r}")
        assert svc.proc.poll() is None
        if mapped != "revocations.sqlite.generation":
            # the meter may refuse while its table is unusable, by the documented code
            assert after.status_code == 200 or \
                after.json()["error"]["code"] == "PROVIDER.UNAVAILABLE", after.text
            return
        # the counter: "without the counter file every check queries as before", and exactly
        assert after.status_code == 200, after.text
        _revoke_elsewhere(svc, "after-truncate")
        _assert_revoked(_read(svc, token, "after-truncate"))


def test_a_revocation_after_a_row_deleted_by_hand_is_refused(tmp_path: Path) -> None:
    """An operator deletes a mistaken revocation with `sqlite3`; the next revocation reuses
    the deleted row's rowid, and a server reading "the rows added since" by rowid misses it."""
    with serving(tmp_path) as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        _revoke_elsewhere(svc, "k1", "mistake")
        _assert_revoked(_read(svc, token, "mistake"))  # the server now holds both keys
        conn = sqlite3.connect(svc.state / "revocations.sqlite", isolation_level=None)
        try:
            conn.execute("DELETE FROM revocations WHERE key = 'mistake'")
        finally:
            conn.close()
        assert _read(svc, token, "stolen").status_code == 200
        _revoke_elsewhere(svc, "stolen")
        _assert_revoked(_read(svc, token, "stolen"))


def test_a_revocation_in_a_recreated_database_is_refused(tmp_path: Path) -> None:
    """The operator deletes `revocations.sqlite` (a corrupt or to-be-reset list) while the
    server runs; the next `revoke` makes a new one. The server sees the file changed, reads it
    again — through its connection to the deleted file — and misses the new revocation, which a
    freshly started process refuses."""
    with serving(tmp_path) as svc:
        token = add_token(svc.state, "acme", "agent:alice")
        _revoke_elsewhere(svc, "old")
        _assert_revoked(_read(svc, token, "old"))
        for suffix in ("", "-wal", "-shm"):
            (svc.state / f"revocations.sqlite{suffix}").unlink(missing_ok=True)
        assert _read(svc, token, "stolen").status_code == 200
        _revoke_elsewhere(svc, "stolen")
        _assert_revoked(_read(svc, token, "stolen"))
