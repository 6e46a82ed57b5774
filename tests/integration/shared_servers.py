"""Real Redis and PostgreSQL servers on loopback for the shared-state tests (issue 18).

``scripts/test.sh`` starts them (scripts/lib/redis.sh, postgres.sh) and exports
``POLICY_ENGINE_TEST_REDIS_URL`` / ``POLICY_ENGINE_TEST_PG_DSN``; when a test runs without them
(plain pytest), these fixtures start their own, in a temporary directory on an ephemeral
loopback port, and stop them at the end of the session. Each test gets its own Redis key
prefix and its own PostgreSQL database, so tests never see each other's state.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from policy_engine.plugin_manager import PluginManager


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check()  # type: ignore[operator]
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not come up: {exc}") from exc
            time.sleep(0.2)


@pytest.fixture(scope="session", name="redis_server")
def redis_server_fixture() -> Iterator[str]:
    """The URL of a Redis on loopback (the test command's, or one started here)."""
    url = os.environ.get("POLICY_ENGINE_TEST_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    assert binary, "redis-server is missing: run scripts/test.sh (it installs the Debian package)"
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="pe-redis-")
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", tmp,
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    _wait(lambda: redis.Redis.from_url(url).ping(), "redis-server")
    yield url
    proc.terminate()
    proc.wait(timeout=20)
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(name="redis_url")
def redis_url_fixture(redis_server: str) -> str:
    return redis_server


@pytest.fixture(name="redis_prefix")
def redis_prefix_fixture() -> str:
    """A key prefix of this test's own."""
    return f"pe-test-{uuid.uuid4().hex[:12]}:"


def _pg_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    assert found, "postgresql is missing: run scripts/test.sh (it installs the Debian package)"
    return found[-1]


def start_postgres() -> tuple[str, Callable[[], None]]:
    """Start a PostgreSQL cluster of its own in a new temporary directory (one the `postgres`
    user can reach) on a free loopback port; returns a superuser DSN and the function that
    stops it and removes the directory (fast shutdown: clients see it go away; idempotent)."""
    bin_dir, port = _pg_bin(), _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="pe-pg-"))
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(tmp, "postgres")
    subprocess.run([*as_postgres, f"{bin_dir}/initdb", "-D", f"{tmp}/data", "-U", "postgres",
                    "--auth=trust", "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run([*as_postgres, f"{bin_dir}/pg_ctl", "-D", f"{tmp}/data", "-l",
                    f"{tmp}/log", "-w", "-o", f"-c listen_addresses=127.0.0.1 -p {port} "
                    f"-c unix_socket_directories={tmp} -c fsync=off", "start"],
                   check=True, capture_output=True)

    def stop() -> None:
        if (tmp / "data").exists():
            subprocess.run([*as_postgres, f"{bin_dir}/pg_ctl", "-D", f"{tmp}/data", "-m",
                            "fast", "-w", "stop"], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    return f"postgresql://postgres@127.0.0.1:{port}/postgres", stop


@pytest.fixture(scope="session", name="pg_server")
def pg_server_fixture() -> Iterator[str]:
    """A DSN of a PostgreSQL superuser on loopback (the test command's, or one started here)."""
    dsn = os.environ.get("POLICY_ENGINE_TEST_PG_DSN")
    if dsn:
        yield dsn
        return
    dsn, stop = start_postgres()
    yield dsn
    stop()


@pytest.fixture(name="pg_dsn")
def pg_dsn_fixture(pg_server: str) -> Iterator[str]:
    """A DSN of a fresh database of this test's own (dropped afterwards)."""
    name = f"pe_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = pg_server.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def dead_redis_url() -> str:
    """A loopback port nothing listens on: a Redis that is down."""
    return f"redis://127.0.0.1:{_free_port()}/0"


def dead_pg_dsn() -> str:
    return f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres"


def scratch(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def plugin_manager() -> PluginManager:
    """Every installed plugin plus the shared-state ones (registered here too while the
    installed metadata predates their entry points; same module, same name)."""
    import plugins.budget_redis
    import plugins.evidence_postgres

    manager = PluginManager.default()
    for name, module in (("budget_redis", plugins.budget_redis),
                         ("evidence_postgres", plugins.evidence_postgres)):
        if not manager.pm.has_plugin(name):
            manager.register(module, name)
    return manager


def entry_points_dir(root: Path) -> Path:
    """A directory to put on ``PYTHONPATH`` so child processes (``policy-engine serve``) find
    the shared-state plugins through the entry-point group, as a pip-installed distribution
    would make them found (the installed metadata of this checkout may predate them)."""
    info = root / "policy_engine_scale_plugins-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: policy-engine-scale-plugins\n"
                                   "Version: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[policy_engine.plugins]\nbudget_redis = plugins.budget_redis\n"
        "evidence_postgres = plugins.evidence_postgres\n")
    return root
