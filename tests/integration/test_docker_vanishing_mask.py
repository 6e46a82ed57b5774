"""A masked host path that vanishes between the mask plan and the container's start does not
fail the call: the start is planned again (at most twice more).

A secret under a host tree the container binds (``system_binds``, default ``/usr``) is masked
by a mount over it; when the secret is removed after the plan and before the container's init
mounts it, runc fails ("error mounting ... to rootfs": it cannot create the mount point in the
read-only bind) and the call failed with ``TOOL.EXECUTION_FAILED``: 3-5 of 15 calls while
another process planted and removed a `.env` under ``/usr/share`` (a package upgrade, or two
tests side by side: CI saw a docker session exec fail this way). The test churns a host tree
of its own, bound as a system tree, not the host's ``/usr``: every sandbox of every other
test binds that, and would see the churn."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.planted import coming_and_going
from tests.integration.test_sessions_runtime import sessions_in

pytestmark = pytest.mark.integration


@pytest.fixture
def system_tree() -> Iterator[Path]:
    """A host tree (world-readable) bound read-only into the containers at its own path."""
    where = Path(tempfile.mkdtemp(prefix="pe-vanish-sys-", dir="/tmp"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def churn(system_tree: Path) -> Iterator[None]:
    """A `.env` in the system tree that lives half a second, then is gone for half a second."""
    with coming_and_going(system_tree, 0.5):
        yield


@pytest.mark.parametrize(("docker", "stateful"), [
    ({"mode": "run-once"}, False), ({"mode": "pool", "pool_size": 1}, False),
    # the live interpreter's container, re-made (and the interpreter restarted) as masks change
    ({"mode": "pool", "pool_size": 1}, True)], ids=["run-once", "pool", "pool-stateful"])
def test_docker_calls_succeed_while_a_masked_host_path_comes_and_goes(
        tmp_path: Path, system_tree: Path, churn: None, docker: dict[str, object],
        stateful: bool) -> None:
    failed = []
    options = {**docker, "system_binds": ["/usr", str(system_tree)]}
    with sessions_in(tmp_path, docker=options) as rt:
        s = rt.create("acme", "alice", backend="docker")
        deadline = time.monotonic() + 120
        for _ in range(20):
            res = (rt.run_code("acme", "alice", s.session_id, "print('ok')", stateful=True)
                   if stateful else
                   rt.run_code("acme", "alice", s.session_id, "echo ok", "shell"))
            if not res.success:
                failed.append((res.refusal or {}).get("message"))
            assert time.monotonic() < deadline
    assert not failed, failed
