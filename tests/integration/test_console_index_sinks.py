"""The console's index reads the SQLite and PostgreSQL evidence sinks the engine really writes.

Real calls through an orchestrator writing to the SQLite sink and to a PostgreSQL database on
loopback (two replicas, each chaining its own records); the index lists every call, filters
them, and sees an edit of a stored record as tampering when the call's page re-reads it.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.console.context import evidence_sources
from policy_engine.console.index import EvidenceIndex
from policy_engine.orchestrator import Orchestrator
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    pg_dsn_fixture,
    pg_server_fixture,
    plugin_manager,
)
from tests.integration.store_fixtures import make_fixture

pytestmark = pytest.mark.integration


def test_the_index_reads_the_sqlite_sink(tmp_path: Path) -> None:
    fx = make_fixture(tmp_path / "fx")
    config = EngineConfig(state_dir=tmp_path / "state", evidence_sinks=("sqlite",),
                          revocation="memory")
    with Orchestrator(compile_files([fx.policy]), config=config,
                      plugins=plugin_manager()) as orch:
        envelopes = [fx.run(orch).envelope_id for _ in range(4)]
    index = EvidenceIndex(tmp_path / "index.sqlite", evidence_sources(config))
    index.sync()
    rows = index.page({"tenant": "t"}).rows
    assert {r["envelope_id"] for r in rows} == set(envelopes)
    assert {r["decision"] for r in rows} == {"allow"}
    first = index.call(envelopes[0], "t")
    assert first is not None
    assert first["chain"] == "intact"
    assert first["end"]["status"] == "ok"


def test_the_index_reads_two_postgres_replicas_and_sees_an_edit(tmp_path: Path,
                                                                  pg_dsn: str) -> None:
    fx = make_fixture(tmp_path / "fx")
    envelopes: dict[str, list[str]] = {}
    for replica in ("a", "b"):
        config = EngineConfig(state_dir=tmp_path / replica, evidence_sinks=("postgres",),
                              revocation="memory",
                              options={"evidence_postgres": {"dsn": pg_dsn, "replica": replica}})
        with Orchestrator(compile_files([fx.policy]), config=config,
                          plugins=plugin_manager()) as orch:
            envelopes[replica] = [fx.run(orch).envelope_id for _ in range(3)]
    index = EvidenceIndex(tmp_path / "index.sqlite", evidence_sources(config))
    assert index.sync() == 12  # begin + end of six calls
    rows = index.page({}).rows
    assert {r["envelope_id"] for r in rows} == set(envelopes["a"] + envelopes["b"])
    # each replica chains its own records: a's first call is followed by a's second
    assert index.call(envelopes["a"][0], None)["chain"] == "intact"
    assert index.call(envelopes["b"][0], None)["chain"] == "intact"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE evidence_records SET record = replace(record, '\"ok\"', "
                     "'\"OK\"') WHERE envelope_id = %s AND type = 'end'",
                     (envelopes["a"][0],))
    edited = index.call(envelopes["a"][0], None)
    assert edited["chain"] == "tampered"
    assert edited["end"]["status"] == "OK"
