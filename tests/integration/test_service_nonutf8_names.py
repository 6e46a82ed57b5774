"""Issue 32 item 6: an exec whose artifact has a name that is not UTF-8 is recorded on both
exec stores (SQLite and a real PostgreSQL), listed losslessly (percent-encoded, marked
``not_utf8``), fetchable by its listed name, and a store failure never echoes database text.
Real `policy-engine serve` subprocesses on loopback; the exec runs in the real sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.integration.service_server import Service, serving
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    pg_dsn_fixture,
    pg_server_fixture,
)

pytestmark = pytest.mark.integration

# the exec plants three names in its artifacts directory: the byte 0xff, a real `%`-name that
# spells what the escape of the first looks like, and a name with a literal percent sign
SCRIPT = ('d="$(ls -d ../artifacts/*/ | head -1)"; printf ff > "$d"/$\'bad\\xffname\'; '
          'printf pct > "$d"/\'bad%FFname\'; printf fifty > "$d"/\'50%.txt\'; '
          'printf v > "$d"/$\'x\\xfe%y\'; echo RAN > ../work/ran.txt')


def _token(svc: Service, config: Path | None) -> str:
    where = ["--config", str(config)] if config else ["--state-dir", str(svc.state)]
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "add",
                           "--tenant", "acme", "--subject", "agent:a", *where],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Service, str]]:
    extra: list[str] = []
    config = None
    if request.param == "postgres":
        dsn = request.getfixturevalue("pg_dsn")
        config = tmp_path / "engine.json"
        config.write_text(json.dumps({"state_dir": str(tmp_path / "state"),
                                      "options": {"service_postgres": {"dsn": dsn}}}))
        extra = ["--config", str(config)]
    with serving(tmp_path, *extra) as svc:
        yield svc, _token(svc, config)


def test_a_non_utf8_artifact_name_is_recorded_listed_and_served(
        backend: tuple[Service, str]) -> None:
    svc, token = backend
    with svc.client(token) as c:
        resp = c.post("/sandbox/execs", json={"project_id": "names", "task_id": "t-names",
                                              "exec": {"kind": "shell", "script": SCRIPT}})
        assert resp.status_code == 200, resp.text  # was 503 retryable on PostgreSQL
        rec = resp.json()
        assert rec["status"] == "ok", rec
        eid = rec["exec_id"]
        listed = [e["exec_id"] for e in c.get("/sandbox/execs",
                                              params={"task_id": "t-names"}).json()["execs"]]
        assert listed == [eid]  # the exec is not missing from the API
        resp = c.get(f"/sandbox/execs/{eid}/artifacts")
        assert resp.status_code == 200, resp.text  # was 500 on SQLite
        arts = {(a["path"], a["not_utf8"]): a for a in resp.json()["artifacts"]}
        assert ("bad%FFname", True) in arts       # the byte, escaped
        assert ("bad%FFname", False) in arts      # the real name that spells the same text
        assert ("50%.txt", False) in arts         # a UTF-8 name is shown as it is
        assert ("x%FE%25y", True) in arts         # in an escaped name `%` is escaped too
        assert arts[("stdout.txt", False)]["size"] == 0
        got = c.get(f"/sandbox/execs/{eid}/artifacts/{quote('x%FE%25y')}")
        assert got.status_code == 200, got.text
        assert got.content == b"v"
        assert c.get(f"/sandbox/execs/{eid}/artifacts/{quote('50%.txt')}").content == b"fifty"
        # where a UTF-8 name spells the same text, the URL serves the UTF-8 file
        assert c.get(f"/sandbox/execs/{eid}/artifacts/{quote('bad%FFname')}").content == b"pct"


def test_the_escape_is_lossless() -> None:
    from policy_engine.service.workspace import artifact_name, artifact_os_name

    for raw in (b"bad\xffname", b"x\xfe%y", b"%ff\xff", b"plain", b"50%.txt", b"\xc3\xa9t\xe9"):
        name = os.fsdecode(raw)
        shown, escaped = artifact_name(name)
        shown.encode("utf-8")  # always text a JSON writer and a JSONB column take
        assert escaped == (raw != b"plain" and raw != b"50%.txt")
        assert os.fsencode(artifact_os_name(shown, escaped)) == raw


def test_a_store_failure_names_the_database_but_not_its_error_text(
        tmp_path: Path, pg_dsn: str) -> None:
    from policy_engine.config import EngineConfig
    from policy_engine.service.pg_stores import StoreUnavailable, open_exec_store

    store = open_exec_store(EngineConfig(state_dir=tmp_path,
                                         options={"service_postgres": {"dsn": pg_dsn}}))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the table goes away under it
        conn.execute("ALTER TABLE sandbox_execs RENAME TO sandbox_execs_gone")
    try:
        with pytest.raises(StoreUnavailable) as err:
            store.get("acme", "e" * 32)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE sandbox_execs_gone RENAME TO sandbox_execs")
    assert "does not exist" in err.value.reason  # the operator's log has the cause
    assert "does not exist" not in err.value.message  # the caller does not
    assert "sandbox_execs" not in err.value.message
    assert err.value.message.startswith("provider unavailable: service database `postgresql:")
