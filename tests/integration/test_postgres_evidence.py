"""PostgreSQL evidence (issue 18 item 1): one chain per replica that `policy-engine evidence
verify` checks, workers sharing a replica name never fork it, and a database that is down
spools the evidence until it answers. A real PostgreSQL on loopback, the real orchestrator.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from plugins.evidence_postgres import PostgresSink
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.orchestrator import Orchestrator
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    pg_dsn_fixture,
    pg_server_fixture,
    plugin_manager,
)
from tests.integration.store_fixtures import Fixture, make_fixture

pytestmark = pytest.mark.integration
CALLS = 6


def _orchestrator(fx: Fixture, state: Path, dsn: str, replica: str) -> Orchestrator:
    config = EngineConfig(state_dir=state, evidence_sinks=("postgres",), revocation="memory",
                          options={"evidence_postgres": {"dsn": dsn, "replica": replica}})
    return Orchestrator(compile_files([fx.policy]), config=config, plugins=plugin_manager())


def worker(root: str, state: str, dsn: str, replica: str) -> None:
    fx = make_fixture(Path(root)) if not (Path(root) / "ws").exists() else _fixture(Path(root))
    with _orchestrator(fx, Path(state), dsn, replica) as orch:
        for _ in range(CALLS):
            assert fx.run(orch).result.ok


def _fixture(root: Path) -> Fixture:
    return Fixture(root, root / "ws", root / "store.sbpolicy", root / "manifest.json",
                   root / "grant.json", root / "request.json")


def verify(dsn: str, replica: str, out: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "plugins.evidence_postgres.export", dsn,
                           replica, str(out)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", "evidence", "verify",
                           str(out), "--format", "json"], capture_output=True, text=True,
                          timeout=60, check=False)


def test_replicas_chain_their_evidence_and_verify_reads_it(tmp_path: Path, pg_dsn: str) -> None:
    fx = make_fixture(tmp_path / "fx")
    ctx = multiprocessing.get_context("spawn")
    # replica a: two processes sharing one name (workers of one host) and a thread pool;
    # replica b: one process. All at once.
    procs = [ctx.Process(target=worker, args=(str(fx.root), str(tmp_path / f"s{i}"), pg_dsn,
                                              replica))
             for i, replica in enumerate(["a", "a", "b"])]
    for p in procs:
        p.start()
    with _orchestrator(fx, tmp_path / "t", pg_dsn, "a") as orch:
        threads = [threading.Thread(target=lambda: [fx.run(orch) for _ in range(CALLS)])
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for p in procs:
        p.join(timeout=180)
        assert p.exitcode == 0
    expected = {"a": 2 * (2 * CALLS + 3 * CALLS), "b": 2 * CALLS}
    for replica, count in expected.items():
        done = verify(pg_dsn, replica, tmp_path / f"{replica}.sqlite")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["ok"] is True
        assert report["records"] == count
    # every envelope has its begin and its end
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT envelope_id, count(*) FROM evidence_records "
                            "GROUP BY envelope_id").fetchall()
    assert len(rows) == sum(expected.values()) // 2
    assert {n for _e, n in rows} == {2}


def test_an_edited_record_in_postgres_fails_verification(tmp_path: Path, pg_dsn: str) -> None:
    fx = make_fixture(tmp_path / "fx")
    with _orchestrator(fx, tmp_path / "s", pg_dsn, "r1") as orch:
        for _ in range(3):
            assert fx.run(orch).result.ok
    with psycopg.connect(pg_dsn) as conn:
        edited = conn.execute("UPDATE evidence_records SET record = replace(record, "
                              "'\"tenant\":\"t\"', '\"tenant\":\"x\"') "
                              "WHERE replica = 'r1' AND seq = 2 AND type = 'begin'")
        assert edited.rowcount == 1
    done = verify(pg_dsn, "r1", tmp_path / "r1.sqlite")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["problems"][0]["kind"] == "edited"


def test_postgres_down_spools_the_evidence_and_delivers_it_in_order(
        tmp_path: Path, pg_dsn: str) -> None:
    fx = make_fixture(tmp_path / "fx")
    base, _name = pg_dsn.rsplit("/", 1)
    missing = f"pe_later_{tmp_path.name[-8:].replace('-', '_')}".lower()
    dsn = f"{base}/{missing}"  # a database that does not exist yet: the store is unavailable
    state = tmp_path / "s"
    with _orchestrator(fx, state, dsn, "r") as orch:
        assert fx.run(orch).result.ok  # the call runs; its evidence waits in the spool
        assert fx.run(orch).result.ok
        spooled = list((state / "spool").glob("*"))
        assert spooled
        assert sum(len(p.read_bytes().splitlines()) for p in spooled) == 4
        assert orch.metrics.sink_failures_total.labels(sink="postgres")._value.get() >= 1
        with psycopg.connect(pg_dsn.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{missing}"')
        try:
            assert fx.run(orch).result.ok  # delivers the spool first, then this call's
            assert sum(len(p.read_bytes().splitlines()) for p in spooled if p.exists()) == 0
            sink = orch.components.sinks["postgres"]
            assert isinstance(sink, PostgresSink)
            kinds = [r["type"] for r in sink.read_records()]
            assert kinds == ["begin", "end"] * 3
            done = verify(dsn, "r", tmp_path / "r.sqlite")
            assert done.returncode == 0, done.stdout
        finally:
            orch.close()
            with psycopg.connect(pg_dsn.rsplit("/", 1)[0] + "/postgres",
                                 autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{missing}" WITH (FORCE)')


def test_the_messages_name_the_database_without_its_password(tmp_path: Path) -> None:
    sink = PostgresSink("postgresql://u:hunter2-pw@127.0.0.1:1/evidence", timeout_s=1)
    with pytest.raises(OSError, match=r"evidence database `postgresql://127.0.0.1:1/evidence`") \
            as err:
        sink._append("e", "begin", '{"type":"begin"}')
    assert "hunter2" not in str(err.value)


def test_signed_checkpoints_cover_the_chain(tmp_path: Path, pg_dsn: str) -> None:
    fx = make_fixture(tmp_path / "fx")
    key, public = tmp_path / "ev.pem", tmp_path / "ev.pub"
    made = subprocess.run([sys.executable, "-m", "policy_engine.cli", "evidence", "keygen",
                           str(key), "--public-key", str(public)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    config = EngineConfig(state_dir=tmp_path / "s", evidence_sinks=("postgres",),
                          revocation="memory", options={"evidence_postgres": {
                              "dsn": pg_dsn, "replica": "signed", "signing_key": str(key),
                              "checkpoint_every": 2}})
    with Orchestrator(compile_files([fx.policy]), config=config,
                      plugins=plugin_manager()) as orch:
        for _ in range(3):
            assert fx.run(orch).result.ok
    out = tmp_path / "signed.sqlite"
    assert subprocess.run([sys.executable, "-m", "plugins.evidence_postgres.export", pg_dsn,
                           "signed", str(out)], check=False, timeout=60).returncode == 0
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "evidence", "verify",
                           str(out), "--public-key", str(public), "--require-signature",
                           "--format", "json"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["checkpoints"] == 3
    assert report["fully_signed"] is True


def test_the_sink_conformance_kit_passes(pg_dsn: str) -> None:
    import plugins.evidence_postgres
    from policy_engine.conformance.sinks import run_sink_suite

    report = run_sink_suite("postgres", options={"evidence_postgres": {
        "dsn": pg_dsn, "replica": "kit"}}, extra_plugins=[plugins.evidence_postgres])
    failed = [(r.id, r.problems) for r in report.results if r.status != "pass"]
    assert failed == []
    assert {r.id for r in report.results} >= {"sink.readable", "sink.complete",
                                                     "sink.no-raw-content", "sink.durable"}


def _default_signed_run(tmp_path: Path, pg_dsn: str, replica: str) -> tuple[Path, Path]:
    """Three calls under a default install (no `signing_key`); the default key's public half."""
    fx = make_fixture(tmp_path / "fx")
    state = tmp_path / "s"
    with _orchestrator(fx, state, pg_dsn, replica) as orch:
        for _ in range(3):
            assert fx.run(orch).result.ok
    key = state / "evidence" / "evidence-signing.pem"
    public = key.with_name(key.name + ".pub")
    return key, public


def _verify_signed(pg_dsn: str, replica: str, out: Path,
                   public: Path) -> subprocess.CompletedProcess[str]:
    assert subprocess.run([sys.executable, "-m", "plugins.evidence_postgres.export", pg_dsn,
                           replica, str(out)], check=False, timeout=60).returncode == 0
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", "evidence", "verify",
                           str(out), "--public-key", str(public), "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_default_install_signs_postgres_checkpoints(tmp_path: Path, pg_dsn: str) -> None:
    replica = f"dflt-{tmp_path.name[-12:]}"
    key, public = _default_signed_run(tmp_path, pg_dsn, replica)
    # like JSONL and SQLite: a 0600 key beside the state's evidence, created at first start
    assert key.is_file()
    assert public.is_file()
    assert key.stat().st_mode & 0o777 == 0o600
    done = _verify_signed(pg_dsn, replica, tmp_path / "whole.sqlite", public)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["fully_signed"] is True


@pytest.mark.parametrize("tamper", ["cut", "edit"])
def test_a_cut_or_edited_postgres_tail_is_detected_by_default(
        tmp_path: Path, pg_dsn: str, tamper: str) -> None:
    replica = f"tail-{tamper}-{tmp_path.name[-12:]}"
    _key, public = _default_signed_run(tmp_path, pg_dsn, replica)
    with psycopg.connect(pg_dsn) as conn:
        last = conn.execute("SELECT max(seq) FROM evidence_records WHERE replica = %s",
                            (replica,)).fetchone()
        assert last is not None
        assert last[0] == 5
        if tamper == "cut":  # the last call's end record removed: a chain alone cannot tell
            changed = conn.execute("DELETE FROM evidence_records WHERE replica = %s AND "
                                   "seq = 5", (replica,))
        else:  # the last record rewritten: nothing after it in the chain to disagree
            changed = conn.execute("UPDATE evidence_records SET record = replace(record, "
                                   "'\"status\":\"ok\"', '\"status\":\"error\"') "
                                   "WHERE replica = %s AND seq = 5 AND record LIKE "
                                   "'%%\"status\":\"ok\"%%'", (replica,))
        assert changed.rowcount == 1
    done = _verify_signed(pg_dsn, replica, tmp_path / "tampered.sqlite", public)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    # cut: the last record is no longer the one a checkpoint signed, so nothing is signed to
    # the end; edit: the signed checkpoint covers a different record
    assert report["fully_signed"] is False
    assert tamper == "cut" or report["problems"][0]["kind"] == "edited"


def test_an_edited_postgres_checkpoint_row_fails(tmp_path: Path, pg_dsn: str) -> None:
    """Issue 32 attack L5 on PostgreSQL: fields added to the last signed checkpoint row (the
    signature covers only ``covers_seq``/``head``) fail verification of the export."""
    replica = f"cpedit-{tmp_path.name[-12:]}"
    _key, public = _default_signed_run(tmp_path, pg_dsn, replica)
    assert _verify_signed(pg_dsn, replica, tmp_path / "good.sqlite", public).returncode == 0
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT id, record FROM evidence_checkpoints WHERE replica = %s "
                           "ORDER BY id DESC LIMIT 1", (replica,)).fetchone()
        assert row is not None
        forged = json.dumps({**json.loads(row[1]), "tenant": "acme", "decision": "allow"})
        conn.execute("UPDATE evidence_checkpoints SET record = %s WHERE id = %s",
                     (forged, row[0]))
    done = _verify_signed(pg_dsn, replica, tmp_path / "tampered.sqlite", public)
    assert done.returncode == 1, done.stdout + done.stderr
    problem = json.loads(done.stdout)["problems"][0]
    assert problem["kind"] == "edited"
    assert "`decision`, `tenant`" in problem["message"]
