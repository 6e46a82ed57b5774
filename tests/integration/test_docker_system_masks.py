"""Mandatory denies inside the host trees a docker container binds (``system_binds``, default
``/usr``) on the real engine: a `.env` planted in such a tree is hidden from every docker call
as proc-bwrap hides it in its own (``extra_ro_binds``) (run-once, a bound session's warm
container, its live interpreter, an unbound pool session), a file beside it stays readable.

Before (outsider attack 35, docker): the container got the host's ``/usr`` read-only and masks
only inside its workspace binds, so ``cat /usr/share/x/.env`` printed the secret.

The secret is planted in a host tree of the test's own, bound beside ``/usr`` (the same code
path as ``/usr``): one planted under the host's ``/usr/share`` changed the masks of every
sandbox of every test running meanwhile (a session's container re-made under another test)."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine.executor import ExecContext
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.model import ProcExecOp
from tests.integration.test_docker_sessions import _containers_binding
from tests.integration.test_proc_sandbox import make_profile
from tests.integration.test_sessions_runtime import sessions_in

pytestmark = pytest.mark.integration


@pytest.fixture
def system_tree() -> Iterator[Path]:
    """A host tree every user may read, bound read-only into every sandbox of the test
    (outside /tmp: a bwrap sandbox has a /tmp of its own, over which only its workspace
    binds are made)."""
    tree = Path(tempfile.mkdtemp(prefix="pe-systree-", dir="/var/tmp"))
    tree.chmod(0o755)
    (tree / "share").mkdir(mode=0o755)
    yield tree
    shutil.rmtree(tree, ignore_errors=True)


def _system_binds(tree: Path) -> list[str]:
    return ["/usr", str(tree)]


@pytest.fixture
def planted(system_tree: Path) -> Iterator[tuple[Path, str]]:
    """A fresh directory in the system tree holding ``.env`` (a secret under the built-in
    mandatory deny ``**/.env``, mode 0644) and ``notes.txt`` (a control), removed after; the
    secret's marker."""
    where = system_tree / "share" / f"pe-sysmask-{uuid.uuid4().hex[:10]}"
    marker = f"SYSMASK_SECRET_{uuid.uuid4().hex}"
    where.mkdir(mode=0o755)
    try:
        (where / ".env").write_text(f"TOKEN={marker}\n")
        (where / ".env").chmod(0o644)
        (where / "notes.txt").write_text("control-readable\n")
        (where / "notes.txt").chmod(0o644)
        yield where, marker
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _cat(where: Path) -> str:
    return f"cat {where}/.env; echo; cat {where}/notes.txt; echo end"


def _masked(out: str, marker: str) -> None:
    assert marker not in out, out
    assert "control-readable" in out, out  # the tree itself is still there
    assert out.strip().endswith("end"), out


@pytest.mark.parametrize("backend", ["docker", "proc-bwrap"])
def test_a_run_once_call_does_not_read_a_secret_under_usr(
        tmp_path: Path, system_tree: Path, planted: tuple[Path, str], backend: str) -> None:
    where, marker = planted
    with sessions_in(tmp_path, docker={"system_binds": _system_binds(system_tree)},
                     proc={"extra_ro_binds": [str(system_tree)]}) as rt:  # docker: run-once
        s = rt.create("acme", "alice", backend=backend)
        res = rt.run_code("acme", "alice", s.session_id, _cat(where), "shell")
        assert res.success, res
        _masked(res.stdout, marker)


def _pool_session(tmp_path: Path, tree: Path) -> Iterator[Sessions]:
    with sessions_in(tmp_path, docker={"mode": "pool", "pool_size": 1,
                                       "system_binds": _system_binds(tree)}) as made:
        yield made


@pytest.fixture
def pool_rt(tmp_path: Path, system_tree: Path) -> Iterator[Sessions]:
    yield from _pool_session(tmp_path, system_tree)


def test_a_session_container_made_before_the_secret_appeared_is_remade(
        pool_rt: Sessions, planted: tuple[Path, str]) -> None:
    """The warm container outlives its calls; the secret is planted after it was made (it
    holds no mask for it): the next plain call gets a container re-made with the mask."""
    where, marker = planted
    secret = where / ".env"
    secret.rename(where / ".env.later")  # not there yet when the container is made
    s = pool_rt.create("acme", "alice", backend="docker")
    work = pool_rt.workspace(s)
    first = pool_rt.run_code("acme", "alice", s.session_id, _cat(where), "shell")
    assert first.success, first.refusal
    assert "control-readable" in first.stdout, first
    before = _containers_binding(work)
    (where / ".env.later").rename(secret)
    time.sleep(0.2)
    seen = pool_rt.run_code("acme", "alice", s.session_id, _cat(where), "shell")
    assert seen.success, seen.refusal
    _masked(seen.stdout, marker)
    after = _containers_binding(work)
    assert len(after) == 1, after
    assert after != before, (before, after)
    # the live interpreter's container is the plain calls' one: masked there too
    code = (f"print(open({str(secret)!r}).read()); "
            f"print(open({str(where / 'notes.txt')!r}).read()); print('end')")
    st = pool_rt.run_code("acme", "alice", s.session_id, code, stateful=True)
    _masked(st.stdout + st.stderr, marker)


def test_an_unbound_pool_session_does_not_read_a_secret_under_usr(
        tmp_path: Path, system_tree: Path, planted: tuple[Path, str]) -> None:
    """A call of no gateway session (``/v1/ops`` in pool mode) runs in one of the pool's
    pre-made containers, made before the secret appeared; the session then holds it while
    the secret appears again: both calls get the mask."""
    where, marker = planted
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1, workspace_root=str(tmp_path),
                                      system_binds=tuple(_system_binds(system_tree))))
    try:
        ex.pool(None)  # its container is made now, before the call plans its masks
        profile = make_profile(tmp_path)

        def cat() -> str:
            ctx = ExecContext(profile=profile, deadline=time.monotonic() + 90)
            out = ex.execute(ctx, ProcExecOp(tool="bash", args=("-c", _cat(where)))).out
            assert out["exit_code"] == 0, out
            return str(out["stdout"])

        _masked(cat(), marker)
        (where / ".env").rename(where / ".env.gone")
        assert "control-readable" in cat()  # the session holds its container now
        (where / ".env.gone").rename(where / ".env")
        time.sleep(0.2)
        _masked(cat(), marker)
    finally:
        ex.close()


def test_a_live_interpreter_gets_the_mask_of_a_secret_planted_under_usr(
        pool_rt: Sessions, planted: tuple[Path, str]) -> None:
    """The interpreter started before the secret appeared (its container holds no mask for
    it); the next stateful call is decided as its plain twin: the container is re-made with
    the mask, the interpreter restarted in it."""
    where, marker = planted
    secret = where / ".env"
    secret.rename(where / ".env.later")
    s = pool_rt.create("acme", "alice", backend="docker")
    code = (f"import os\nprint(open({str(where / 'notes.txt')!r}).read())\n"
            f"if os.path.exists({str(secret)!r}): print(open({str(secret)!r}).read())\n"
            "print('end')")
    first = pool_rt.run_code("acme", "alice", s.session_id, code, stateful=True)
    assert first.success, first
    assert "control-readable" in first.stdout, first
    (where / ".env.later").rename(secret)
    time.sleep(0.2)
    seen = pool_rt.run_code("acme", "alice", s.session_id, code, stateful=True)
    _masked(seen.stdout, marker)
