"""Issue 32 item 3 (N3/N4), against the real Docker engine: a warm-pool call ends with no
process of its own left in the session's container (a background child it started does not
run on into the session's next call), an idle session gives its container back after
``pool_idle_s`` (with ``pool_size: 1`` a second tenant is no longer starved), and
``release_session`` (the sessions feature's call) frees it at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from policy_engine import ErrorCode, PolicyEngineError
from tests.integration.test_docker_pool import make_profile, run

pytestmark = pytest.mark.integration

# a detached background child (own session, output not on the call's pipes) that would go
# on appending to a work file
PLANT = ("import subprocess; subprocess.Popen(['/bin/sh', '-c', 'while :; do echo x >> "
         "/workspace/work/bg.log; sleep 0.1; done'], start_new_session=True, "
         "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
         "print('planted')")
# every live process of the container but PID 1 and this one (a killed child of `sleep
# infinity`, PID 1 without the launcher, stays a zombie: dead, and counted in the container's
# pids limit until the session's container is discarded), and how bg.log grows meanwhile
LOOK = ("import os, time\n"
        "me = os.getpid()\n"
        "def live(p):\n"
        "    try: return open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
        "    except OSError: return False\n"
        "others = sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in "
        "(1, me) and live(p))\n"
        "def size():\n"
        "    try: return os.path.getsize('/workspace/work/bg.log')\n"
        "    except OSError: return -1\n"
        "a = size(); time.sleep(0.6); b = size()\n"
        "print(others, a, b)\n")


@pytest.fixture(params=[True, False], ids=["launcher", "docker-exec"])
def one_slot(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DockerExecutor]:
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1, workspace_root=str(tmp_path),
                                      pool_launcher=request.param, pool_idle_s=2.0))
    yield ex
    ex.close()


def test_a_call_leaves_no_process_behind_for_the_next_call(one_slot: DockerExecutor,
                                                           tmp_path: Path) -> None:
    prof = make_profile(tmp_path)
    assert run(one_slot, prof, PLANT)["stdout"] == "planted\n"
    seen = run(one_slot, prof, LOOK)["stdout"].split("] ")
    others, sizes = seen[0] + "]", seen[1].split()
    assert others == "[]", seen  # nothing of the first call runs in the second
    assert sizes[0] == sizes[1], seen  # and nothing writes to the session's files


def test_an_idle_session_gives_its_container_back(one_slot: DockerExecutor,
                                                  tmp_path: Path) -> None:
    alice, bob = make_profile(tmp_path, "agent:alice"), make_profile(tmp_path, "agent:bob")
    assert run(one_slot, alice, "print('a')")["stdout"] == "a\n"
    started = time.monotonic()
    assert run(one_slot, bob, "print('b')")["stdout"] == "b\n"  # waited for alice's idle end
    assert time.monotonic() - started < 15
    pool = one_slot.pool()
    assert pool.idle_released >= 1


def test_release_session_frees_the_container_at_once(tmp_path: Path) -> None:
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1, workspace_root=str(tmp_path),
                                      pool_idle_s=3600.0))
    try:
        alice, bob = make_profile(tmp_path, "agent:alice"), make_profile(tmp_path, "agent:bob")
        run(ex, alice, "open('/workspace/work/mine', 'w').write('alice')")
        pool = ex.pool()
        with pytest.raises(PolicyEngineError) as err:  # held by alice: bob waits, then no
            pool.acquire("someone-else", timeout_s=1.0)
        assert err.value.code is ErrorCode.PROVIDER_UNAVAILABLE
        ex.release_session(alice.tenant, alice.subject_id, alice.tool_name)
        out = run(ex, bob, "import os; print(os.path.exists('/workspace/work/mine'))")
        assert out["stdout"] == "False\n"  # a fresh container: nothing of alice's
    finally:
        ex.close()


def test_pool_idle_s_is_validated() -> None:
    assert DockerOptions.parse({"pool_idle_s": 30}).pool_idle_s == 30.0
    assert DockerOptions.parse({}).pool_idle_s == 60.0
    for bad in (0, -1, "5", True, 86401):
        with pytest.raises(ValueError, match="pool_idle_s"):
            DockerOptions.parse({"pool_idle_s": bad})
