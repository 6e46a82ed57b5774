"""Redis meter, slots and revocations shared by several engine processes (issue 18 item 1):
a real redis-server on loopback, real processes, the real orchestrator and fs executor.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plugins.budget_redis import RedisBudgetMeter, RedisRevocationList, RedisStore
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.orchestrator import Orchestrator
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    dead_redis_url,
    plugin_manager,
    redis_prefix_fixture,
    redis_server_fixture,
    redis_url_fixture,
)
from tests.integration.store_fixtures import Fixture, make_fixture

pytestmark = pytest.mark.integration

LIMIT = 40
ATTEMPTS = 30  # per process: 6 × 30 = 180 attempts on 40 units


def _meter(url: str, prefix: str) -> RedisBudgetMeter:
    return RedisBudgetMeter(RedisStore(url, prefix=prefix))


def charge_worker(url: str, prefix: str, key: str, start: float,
                  out: multiprocessing.Queue[int]) -> None:
    meter = _meter(url, prefix)
    while time.time() < start:  # all processes charge at the same moment
        time.sleep(0.001)
    ok = 0
    for _ in range(ATTEMPTS):
        try:
            meter.check_and_consume(key, "calls", 1, LIMIT)
            ok += 1
        except PolicyEngineError as exc:
            if exc.code is not ErrorCode.BUDGET_EXCEEDED:
                raise
    out.put(ok)
    meter.close()


def test_concurrent_charges_from_processes_spend_exactly_the_limit(redis_url: str,
                                                                   redis_prefix: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(3):  # repeated: a lost race would show as N+1 sooner or later
        key = f"t/agent/round-{round_}"
        out: multiprocessing.Queue[int] = ctx.Queue()
        start = time.time() + 1.5
        procs = [ctx.Process(target=charge_worker, args=(redis_url, redis_prefix, key, start,
                                                          out)) for _ in range(6)]
        for p in procs:
            p.start()
        granted = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        assert sum(granted) == LIMIT, granted
        assert _meter(redis_url, redis_prefix).used(key) == {"calls": LIMIT}


def test_a_charge_over_the_limit_consumes_nothing(redis_url: str, redis_prefix: str) -> None:
    meter = _meter(redis_url, redis_prefix)
    assert meter.check_and_consume("k", "bytes_out", 70, 100) == 70
    with pytest.raises(PolicyEngineError) as err:
        meter.check_and_consume("k", "bytes_out", 31, 100)
    assert err.value.code is ErrorCode.BUDGET_EXCEEDED
    assert err.value.audit["used"] == 70
    assert meter.check_and_consume("k", "bytes_out", 30, 100) == 100
    assert meter.check_and_consume("k", "calls", 5, None) == 5  # unlimited
    assert meter.used("k") == {"bytes_out": 100, "calls": 5}


def slot_worker(url: str, prefix: str, start: float, out: multiprocessing.Queue[str],
                hold: multiprocessing.Event) -> None:  # type: ignore[valid-type]
    meter = _meter(url, prefix)
    while time.time() < start:
        time.sleep(0.001)
    try:
        lease = meter.acquire("t/agent/slots", 2, hold_s=60)
    except PolicyEngineError as exc:
        out.put(exc.code.value)
        return
    out.put("slot")
    hold.wait(60)  # hold the slot while the others try
    meter.release("t/agent/slots", lease)


def test_concurrency_slots_hold_across_processes(redis_url: str, redis_prefix: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[str] = ctx.Queue()
    hold = ctx.Event()
    start = time.time() + 1.5
    procs = [ctx.Process(target=slot_worker, args=(redis_url, redis_prefix, start, out, hold))
             for _ in range(5)]
    for p in procs:
        p.start()
    answers = sorted(out.get(timeout=120) for _ in procs)
    assert answers.count("slot") == 2, answers
    assert answers.count(ErrorCode.BUDGET_EXCEEDED.value) == 3, answers
    hold.set()
    for p in procs:
        p.join(timeout=60)
    # released: both slots are free again
    meter = _meter(redis_url, redis_prefix)
    leases = [meter.acquire("t/agent/slots", 2, hold_s=5) for _ in range(2)]
    assert len(set(leases)) == 2


def test_a_killed_holder_frees_its_slot_at_the_next_acquire(redis_url: str,
                                                            redis_prefix: str) -> None:
    code = ("import sys,time; from plugins.budget_redis import RedisBudgetMeter, RedisStore;"
            f"m=RedisBudgetMeter(RedisStore({redis_url!r}, prefix={redis_prefix!r}));"
            "m.acquire('g', 1, hold_s=600); print('held', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=os.environ.copy())
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    meter = _meter(redis_url, redis_prefix)
    with pytest.raises(PolicyEngineError) as err:
        meter.acquire("g", 1, hold_s=5)
    assert err.value.code is ErrorCode.BUDGET_EXCEEDED
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=20)
    assert meter.acquire("g", 1, hold_s=5)  # the dead holder's lease (600 s) was dropped


def _orchestrator(fx: Fixture, state: Path, url: str, prefix: str) -> Orchestrator:
    from policy_engine.compiler import compile_files
    from policy_engine.config import EngineConfig

    config = EngineConfig(state_dir=state, budget_meter="redis", revocation="redis",
                          options={"budget_redis": {"url": url, "prefix": prefix}})
    return Orchestrator(compile_files([fx.policy]), config=config, plugins=plugin_manager())


def test_a_revocation_is_seen_at_once_by_another_orchestrator(
        tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    fx = make_fixture(tmp_path / "fx")
    with _orchestrator(fx, tmp_path / "a", redis_url, redis_prefix) as a, \
            _orchestrator(fx, tmp_path / "b", redis_url, redis_prefix) as b:
        assert isinstance(a.revocations, RedisRevocationList)
        assert fx.run(a).result.ok
        assert fx.run(b).result.ok
        a.revocations.revoke("call-0")  # the grant's call id, through replica a
        refused = fx.run(b).result
        assert not refused.ok
        assert refused.code == ErrorCode.PERMISSION_DENY.value
        assert "revoked" in str(refused.message)
        # and both replicas charged one budget: two calls allowed before the revocation
        assert a.meter.used("t/agent:b/call-0")["calls"] == 2


def test_redis_down_fails_budgets_closed_naming_the_store(tmp_path: Path) -> None:
    fx = make_fixture(tmp_path / "fx")
    url = dead_redis_url().replace("redis://", "redis://user:s3cret-pw@")
    with _orchestrator(fx, tmp_path / "s", url, "x:") as orch:
        outcome = fx.run(orch).result
    assert not outcome.ok
    assert outcome.code == ErrorCode.PROVIDER_UNAVAILABLE.value
    assert "redis://127.0.0.1:" in str(outcome.message)
    assert "s3cret-pw" not in str(outcome.message)  # credentials never shown
    meter = RedisBudgetMeter(RedisStore(url, timeout_s=0.5))
    for call in (lambda: meter.check_and_consume("k", "calls", 1, 5),
                 lambda: meter.acquire("k", 1, hold_s=1)):
        with pytest.raises(PolicyEngineError) as err:
            call()
        assert err.value.code is ErrorCode.PROVIDER_UNAVAILABLE
        assert err.value.reason.startswith("budget store `redis://127.0.0.1:")


def test_budget_keys_expire_after_key_ttl_s_and_only_then(redis_url: str,
                                                          redis_prefix: str) -> None:
    import redis as redis_client

    meter = RedisBudgetMeter(RedisStore(redis_url, prefix=redis_prefix, key_ttl_s=100))
    meter.check_and_consume("ttl", "calls", 1, 5)
    raw = redis_client.Redis.from_url(redis_url)
    ttl = raw.pttl(f"{redis_prefix}budget:ttl")
    assert 90_000 < ttl <= 100_000
    raw.pexpire(f"{redis_prefix}budget:ttl", 50_000)  # later charges never extend it
    meter.check_and_consume("ttl", "calls", 1, 5)
    assert raw.pttl(f"{redis_prefix}budget:ttl") <= 50_000
    forever = _meter(redis_url, redis_prefix)  # the default keeps budgets for ever
    forever.check_and_consume("kept", "calls", 1, 5)
    assert raw.pttl(f"{redis_prefix}budget:kept") == -1
