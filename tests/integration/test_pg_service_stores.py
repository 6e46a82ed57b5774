"""The service's PostgreSQL token and exec-record stores (issue 18 item 1) on a real server:
shared by two store instances (two replicas), tenant-scoped, migrated once however many start
at once, and unavailable → PROVIDER.UNAVAILABLE naming the database, never a guess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from policy_engine.config import EngineConfig
from policy_engine.errors import ErrorCode
from policy_engine.service.models import Artifact, ExecRecord
from policy_engine.service.pg_stores import (
    MIGRATIONS,
    PgDatabase,
    PgExecStore,
    PgTokenStore,
    StoreUnavailable,
    open_exec_store,
    open_token_store,
)
from policy_engine.tokens import TokenStore
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    dead_pg_dsn,
    pg_dsn_fixture,
    pg_server_fixture,
)

pytestmark = pytest.mark.integration


def _record(exec_id: str, task: str) -> ExecRecord:
    return ExecRecord(exec_id=exec_id, project_id="p", task_id=task, conversation_id=None,
                      skill_id=None, cmd="bash", args=["-lc", "<digest>"], cwd="/w",
                      env_keys=["HOME"], policy_snapshot={"profile_hash": "h"}, status="ok",
                      exit_code=0, error_code=None, error_reason=None, started_at=1,
                      ended_at=2, duration_ms=1.5, artifacts_path="/a", stdout_truncated=False,
                      stderr_truncated=True, envelope_id="env-" + exec_id)


def test_tokens_added_on_one_replica_authenticate_and_revoke_on_the_other(
        tmp_path: Path, pg_dsn: str) -> None:
    config = EngineConfig(state_dir=tmp_path, options={"service_postgres": {"dsn": pg_dsn}})
    one, two = open_token_store(config), open_token_store(config)
    assert isinstance(one, PgTokenStore)
    bearer, info = one.add("acme", "agent:x", "ci")
    who = two.authenticate(bearer)
    assert who is not None
    assert (who.tenant, who.subject, who.token_id) == ("acme", "agent:x", info.token_id)
    assert two.authenticate(bearer[:-1] + ("A" if bearer[-1] != "A" else "B")) is None
    assert one.revoke(info.token_id) is True
    assert two.authenticate(bearer) is None  # at once, on the other instance
    assert [t.revoked_at is not None for t in two.list()] == [True]
    with psycopg.connect(pg_dsn) as conn:  # only the hash is stored
        stored = conn.execute("SELECT * FROM service_tokens").fetchall()
    assert bearer.split(".", 1)[1] not in repr(stored)
    assert not (tmp_path / "tokens.sqlite").exists()


def test_exec_records_round_trip_per_tenant(tmp_path: Path, pg_dsn: str) -> None:
    config = EngineConfig(state_dir=tmp_path, options={"service_postgres": {"dsn": pg_dsn}})
    store = open_exec_store(config)
    assert isinstance(store, PgExecStore)
    art = Artifact.model_validate({"path": "stdout.txt", "size": 3, "sha256": "0" * 64})
    store.add("acme", "agent:x", _record("e1", "t1"), [art])
    store.add("acme", "agent:x", _record("e2", "t2"), [])
    other = open_exec_store(config)  # another replica's instance
    assert other.get("acme", "e1") == _record("e1", "t1")
    assert other.get("evil", "e1") is None  # another tenant's record is simply not found
    assert other.artifacts("acme", "e1") == [art]
    assert [r.exec_id for r in other.list("acme", "t2")] == ["e2"]
    assert {r.exec_id for r in other.list("acme", None)} == {"e1", "e2"}


def test_replicas_starting_together_migrate_once(pg_dsn: str) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            PgDatabase(pg_dsn).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT component, version FROM policy_engine_migrations").fetchall()
    # every migration, each applied once
    assert rows == [("service", v) for v in range(1, len(MIGRATIONS) + 1)]


def test_a_database_that_is_down_is_named_without_its_password(tmp_path: Path) -> None:
    dsn = dead_pg_dsn().replace("postgres@", "postgres:pw-s3cret@")
    config = EngineConfig(state_dir=tmp_path, options={"service_postgres": {"dsn": dsn}})
    with pytest.raises(StoreUnavailable) as err:
        open_token_store(config)
    assert err.value.code == ErrorCode.PROVIDER_UNAVAILABLE.value
    assert err.value.http_status == 503
    assert err.value.reason.startswith("service database `postgresql://127.0.0.1:")
    assert "pw-s3cret" not in err.value.reason + err.value.message
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "list",
                           "--config", str(_config_file(tmp_path, dsn))], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "service database `postgresql://127.0.0.1:" in done.stderr
    assert "pw-s3cret" not in done.stderr


def _config_file(root: Path, dsn: str) -> Path:
    path = root / "engine.json"
    path.write_text(json.dumps({"options": {"service_postgres": {"dsn": dsn}}}))
    return path


def test_without_a_dsn_the_sqlite_stores_stay_the_default(tmp_path: Path) -> None:
    store = open_token_store(EngineConfig(state_dir=tmp_path))
    assert type(store) is TokenStore
    store.close()
    assert (tmp_path / "tokens.sqlite").exists()
