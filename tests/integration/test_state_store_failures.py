"""Broken state stores fail safely and say which file and why, through the CLI and the API.

Budget and revocation stores fail closed: the call is denied with ``PROVIDER.UNAVAILABLE``
naming the file and the cause, and its begin and end records are written. An evidence sink
that cannot be opened at start-up stops the engine before any call, naming the file and the
cause on the last line. Real files throughout: ``chattr +i``, garbage databases, read-only and
full tmpfs mounts (root needed).
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.orchestration.revocation import SqliteRevocationList
from policy_engine.orchestrator import Orchestrator, RunOutcome
from tests.integration.store_fixtures import (
    Fixture,
    envelopes,
    fill,
    make_fixture,
    small_tmpfs,
)

pytestmark = pytest.mark.integration

UNAVAILABLE = "PROVIDER.UNAVAILABLE"


@pytest.fixture
def fx(tmp_path: Path) -> Fixture:
    return make_fixture(tmp_path / "fx")


@contextmanager
def immutable(path: Path) -> Iterator[Path]:
    """``chattr +i``: not even root may write it (chmod would not stop root)."""
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def corrupt(db: Path) -> None:
    db.write_bytes(b"x" * 4096)
    for extra in db.parent.glob(db.name + "-*"):  # -wal, -shm
        extra.unlink()


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[-1] if lines else ""


def assert_denied_with_evidence(state: Path, envelope: str) -> None:
    """The call's begin and end are on disk and the end carries the code."""
    kinds, bad = envelopes(state / "evidence" / "evidence.jsonl")
    assert bad == []
    assert kinds[envelope] == ["begin", "end"]
    assert all(k == ["begin", "end"] for k in kinds.values())
    end = [json.loads(line) for line in (state / "evidence" / "evidence.jsonl").read_text()
           .splitlines() if envelope in line][-1]
    assert end["status"] == "denied"
    assert end["error_code"] == UNAVAILABLE


def assert_store_named(text: str, store: Path, cause: str) -> None:
    assert f"`{store}` cannot be used: {cause}" in text, text
    assert "Traceback" not in text


# -- budget store ------------------------------------------------------------------------------


def test_cli_unwritable_budget_store_denies_with_path_cause_and_both_records(
        fx: Fixture, tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert fx.cli(state).returncode == 0
    db = state / "budget.sqlite"
    with immutable(db):
        done = fx.cli(state, "--format", "json")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    out = json.loads(done.stdout)
    assert out["result"]["code"] == UNAVAILABLE
    assert_store_named(out["result"]["message"], db, "attempt to write a readonly database")
    assert out["evidence"]["error_code"] == UNAVAILABLE
    assert_denied_with_evidence(state, out["envelope_id"])


def test_api_unwritable_budget_store_denies_then_recovers(fx: Fixture, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with fx.orchestrator(state) as orch:
        assert fx.run(orch).result.ok
    db = state / "budget.sqlite"
    with immutable(db):
        orch = fx.orchestrator(state)  # opens the store read-only: it cannot write
        denied: RunOutcome = fx.run(orch)
    with orch:
        assert not denied.result.ok
        assert denied.result.code == UNAVAILABLE
        assert_store_named(denied.result.message or "", db,
                           "attempt to write a readonly database")
        assert denied.end.status == "denied"
        again = fx.run(orch)  # repaired: the next call reconnects, charges and runs
        assert again.result.ok, again.result.message
        used = orch.meter.used(
            f"{again.begin.tenant}/{again.begin.subject_id}/{again.begin.call_id}")
    assert used["calls"] == 2  # the denied call charged nothing
    assert_denied_with_evidence(state, denied.envelope_id)


def test_api_budget_store_failing_while_running_refuses_calls_from_the_next_write(
        fx: Fixture, tmp_path: Path) -> None:
    """The budget store starts refusing writes while the engine runs (the database and its
    write-ahead log made immutable). Charges are written behind (plugins/budget_sqlite/
    shared.py): the failed write behind is found within its interval, and from then on every
    call is refused before it runs, with both records; what the table took before is written
    once the database takes writes again, so no charge is lost.
    """
    state = tmp_path / "state"
    with fx.orchestrator(state) as orch:
        first = fx.run(orch)
        assert first.result.ok
        key = f"{first.begin.tenant}/{first.begin.subject_id}/{first.begin.call_id}"
        with immutable(state / "budget.sqlite"), immutable(state / "budget.sqlite-wal"):
            taken = fx.run(orch)  # the table takes it; the database does not yet
            deadline = time.monotonic() + 10
            refused = fx.run(orch)
            while refused.result.ok and time.monotonic() < deadline:
                time.sleep(0.05)  # the write behind runs at most every 0.2 s
                refused = fx.run(orch)
        assert taken.result.ok
        assert refused.result.code == UNAVAILABLE
        assert_store_named(refused.result.message or "", state / "budget.sqlite",
                           "attempt to write a readonly database")
        assert refused.result.out == {}
        assert refused.end.status == "denied"
        again = fx.run(orch)  # repaired: the write behind succeeds first, then it runs
        assert again.result.ok, again.result.message
        charged = orch.meter.used(key)["calls"]
    assert_denied_with_evidence(state, refused.envelope_id)
    # every call that ran is counted in the database itself, the ones taken while it failed too
    with sqlite3.connect(state / "budget.sqlite") as conn:
        (calls,) = conn.execute("SELECT used FROM budget_usage WHERE grant_key = ? AND "
                                "kind = 'calls'", (key,)).fetchone()
    assert calls == charged


def test_cli_corrupted_budget_store_denies_naming_it(fx: Fixture, tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert fx.cli(state).returncode == 0
    db = state / "budget.sqlite"
    corrupt(db)
    done = fx.cli(state)
    assert done.returncode == 1, done.stderr
    assert_store_named(done.stdout, db, "file is not a database")
    assert f"result: {UNAVAILABLE}" in done.stdout
    assert_store_named(done.stderr, db, "file is not a database")  # logged at start-up too
    envelope = re.search(r"^evidence: ([0-9a-f]+) ", done.stdout, re.MULTILINE)
    assert envelope is not None
    assert_denied_with_evidence(state, envelope.group(1))


# -- revocation list ---------------------------------------------------------------------------


def test_cli_corrupted_revocation_list_denies_with_path_cause_and_both_records(
        fx: Fixture, tmp_path: Path) -> None:
    """The reproducer (revocations-corrupt.sh): a traceback before."""
    state = tmp_path / "state"
    assert fx.cli(state).returncode == 0
    db = state / "revocations.sqlite"
    corrupt(db)
    done = fx.cli(state, "--format", "json")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    out = json.loads(done.stdout)
    assert out["decision"]["decision"] == "deny"
    assert out["decision"]["code"] == UNAVAILABLE
    assert_store_named(out["result"]["message"], db, "file is not a database")
    assert_denied_with_evidence(state, out["envelope_id"])


def test_api_corrupted_revocation_list_denies_until_replaced(fx: Fixture, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = state / "revocations.sqlite"
    db.write_bytes(b"x" * 4096)
    with fx.orchestrator(state) as orch:
        denied = fx.run(orch)
        assert denied.decision.code == UNAVAILABLE
        assert_store_named(denied.result.message or "", db, "file is not a database")
        db.unlink()  # the operator restores the list (here: an empty one)
        assert fx.run(orch).result.ok
        SqliteRevocationList(db).revoke("call-0")
        revoked = fx.run(orch)  # a working list still revokes
        assert revoked.result.code == "SANDBOX.PERMISSION_DENY"
    assert_denied_with_evidence(state, denied.envelope_id)


def test_revoke_on_an_unusable_list_raises_a_coded_error(tmp_path: Path) -> None:
    db = tmp_path / "revocations.sqlite"
    db.write_bytes(b"x" * 4096)
    revocations = SqliteRevocationList(db)
    with pytest.raises(Exception, match=r"revocation list `.*` cannot be used: file is not a") \
            as err:
        revocations.revoke("call-0")
    assert getattr(err.value, "code", None) == UNAVAILABLE
    revocations.close()


# -- the whole state directory -----------------------------------------------------------------


@contextmanager
def read_only(mountpoint: Path, seed: Path | None = None) -> Iterator[Path]:
    """A tmpfs at ``mountpoint`` holding a copy of ``seed``, then remounted read-only."""
    with small_tmpfs(mountpoint, "4m"):
        if seed is not None:
            subprocess.run(["cp", "-a", f"{seed}/.", str(mountpoint)], check=True)
        subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)
        yield mountpoint


@pytest.mark.parametrize("seeded", [True, False], ids=["used-before", "empty"])
def test_cli_read_only_state_dir_names_the_evidence_log_and_the_cause_last(
        fx: Fixture, tmp_path: Path, seeded: bool) -> None:
    seed = tmp_path / "seed"
    if seeded:
        assert fx.cli(seed).returncode == 0
    with read_only(tmp_path / "state", seed if seeded else None) as state:
        done = fx.cli(state)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "not provided by any loaded plugin" not in done.stderr
    log = state / "evidence" / "evidence.jsonl"
    if seeded:
        assert last_line(done) == (f"error: evidence sink `jsonl` could not be started: plugin "
                                   f"`evidence_jsonl`: OSError: cannot open evidence log `{log}`:"
                                   " Read-only file system")
    else:  # the first thing a fresh state dir needs is the key that digests arguments
        key = state / "keys" / "evidence-hmac.key"
        assert last_line(done) == (f"error: evidence key `{key}` cannot be created or read: "
                                   "Read-only file system")


def test_api_read_only_state_dir_refuses_to_start_with_the_cause(
        fx: Fixture, tmp_path: Path) -> None:
    with read_only(tmp_path / "state") as state, \
            pytest.raises(ValueError, match=r"evidence key `.*/keys/evidence-hmac\.key` cannot "
                                            r"be created or read: Read-only file system"):
        fx.orchestrator(state)
    seed = tmp_path / "seed"
    fx.orchestrator(seed).close()  # a used state dir has its key: the sink is what fails
    with read_only(tmp_path / "state", seed) as state, \
            pytest.raises(ValueError, match=r"could not be started: .*`.*/evidence/evidence"
                                            r"\.jsonl`: Read-only file system"):
        fx.orchestrator(state)


def test_cli_unwritable_evidence_dir_alone_stops_start_up(fx: Fixture, tmp_path: Path) -> None:
    """The documented choice: a sink that cannot even be opened stops the engine (exit 2),
    although budget, revocations and spool would work; nothing runs without its evidence.
    """
    state = tmp_path / "state"
    assert fx.cli(state).returncode == 0
    seed = tmp_path / "seed"
    (state / "evidence").rename(seed)
    with read_only(state / "evidence", seed):
        done = fx.cli(state)
    assert done.returncode == 2
    assert last_line(done).endswith(f"cannot open evidence log `{state}/evidence/evidence.jsonl"
                                    "`: Read-only file system")
    assert "result:" not in done.stdout  # nothing ran


def test_cli_corrupted_evidence_database_names_it(fx: Fixture, tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "engine.yaml"
    config.write_text("evidence_sinks: [jsonl, sqlite]\n")
    assert fx.cli(state, "--config", str(config)).returncode == 0
    corrupt(state / "evidence" / "evidence.sqlite")
    done = fx.cli(state, "--config", str(config))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert last_line(done).endswith(
        f"cannot open evidence database `{state}/evidence/evidence.sqlite`: "
        "file is not a database")


def test_cli_full_state_dir_denies_naming_the_store_then_recovers(
        fx: Fixture, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with small_tmpfs(state, "1m"):
        assert fx.cli(state).returncode == 0
        filler = fill(state)
        done = fx.cli(state)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert f"result: {UNAVAILABLE}" in done.stdout
        assert f"the file system of `{state}` is full" in done.stdout
        filler.unlink()
        assert fx.cli(state).returncode == 0
        kinds, bad = envelopes(state / "evidence" / "evidence.jsonl")
    assert bad == []
    assert all(k == ["begin", "end"] for k in kinds.values())


def test_api_sink_and_spool_both_failing_never_raise_into_the_call(
        fx: Fixture, tmp_path: Path) -> None:
    """The evidence disk fills and the spool is read-only: the call still runs (a failing
    sink never blocks one), and the lost records are counted and logged, not raised.
    """
    state = tmp_path / "state"
    with small_tmpfs(state / "evidence"), read_only(state / "spool"):
        with fx.orchestrator(state) as orch:
            first = fx.run(orch)
            fill(state / "evidence")
            outcomes = [fx.run(orch) for _ in range(5)]
            sink = next(s for s in orch.sinks if s.name == "jsonl")
        assert all(o.result.ok for o in [first, *outcomes])
        assert sink.lost >= 1
        assert orch.metrics.sink_failures_total.labels(sink="jsonl")._value.get() >= sink.lost
        kinds, bad = envelopes(state / "evidence" / "evidence.jsonl")
    assert bad == []  # what did reach the log is whole
    assert kinds[first.envelope_id] == ["begin", "end"]


class BrokenWatcher:
    """A third-party revocation watcher whose backend is down."""

    def is_revoked(self, grant: object) -> bool:
        raise ConnectionError("revocation service at 127.0.0.1:1 refused the connection")


def test_api_a_watcher_raising_anything_fails_closed(fx: Fixture, tmp_path: Path) -> None:
    state = tmp_path / "state"
    orch = Orchestrator(compile_files([fx.policy]), config=EngineConfig(state_dir=state),
                        revocations=BrokenWatcher())
    with orch:
        denied = fx.run(orch)
    assert denied.decision.code == UNAVAILABLE
    assert "ConnectionError: revocation service" in (denied.result.message or "")
    assert_denied_with_evidence(state, denied.envelope_id)
