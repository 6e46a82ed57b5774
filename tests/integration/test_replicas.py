"""Two `policy-engine serve` replicas, one Redis, one PostgreSQL (issue 18 item 3): budgets
exact across replicas, revocations and token revocations seen at once by the other replica,
one verifiable chain per replica, a policy reload reaching both, and a replica killed with
SIGKILL mid-load losing no completed call's evidence. Real servers on loopback throughout.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
import redis

from tests.integration.service_server import grant, manifest
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    entry_points_dir,
    pg_dsn_fixture,
    pg_server_fixture,
    redis_prefix_fixture,
    redis_server_fixture,
    redis_url_fixture,
    start_postgres,
)

pytestmark = pytest.mark.integration

POLICY = """policy "svc/replicas" version "1.0.0"
permit "read-data" fs.read  paths ["{root}/data/**"]
permit "one-at-a-time" proc.exec  tool "sleep"  limits {{ concurrency 1  timeout 30s }}
"""
SLEEPER = {"name": "sleeper", "version": "1.0.0", "side_effects": ["Process"],
           "permissions": [{"kind": "proc.exec", "tool": "sleep"}]}
FORBID = 'forbid "frozen" fs.read  paths ["{root}/data/**"]\n'


class Replica:
    """One `policy-engine serve` process on its own loopback port and state directory."""

    def __init__(self, root: Path, name: str, config: Path, policy: Path, env: dict[str, str],
                 *extra: str) -> None:
        self.root, self.name = root, name
        self.log = root / f"{name}.log"
        with self.log.open("w") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "policy_engine.cli", "serve", "--policy", str(policy),
                 "--config", str(config), "--state-dir", str(root / name), "--root-fs",
                 str(root), "--port", "0", "--manifest", str(root / "reader.json"),
                 "--reload-interval", "0.3", *extra],
                stderr=sink, stdout=subprocess.DEVNULL, env=env)
        deadline, match = time.monotonic() + 60, None
        while match is None:
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", self.log.read_text())
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        self.url = match.group(1)
        while True:
            try:
                httpx.get(f"{self.url}/sandbox/health", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str, redis_prefix: str,
            pg_dsn: str) -> Iterator[tuple[list[Replica], Path, dict[str, str]]]:
    root = tmp_path
    (root / "data").mkdir()
    (root / "data" / "hello.txt").write_text("hello\n")
    (root / "reader.json").write_text(json.dumps(manifest(root)))
    (root / "sleeper.json").write_text(json.dumps(SLEEPER))
    policy = root / "shared.sbpolicy"  # one policy file, as from a shared config volume
    policy.write_text(POLICY.format(root=root))
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(entry_points_dir(root / "ep")),
                                         env.get("PYTHONPATH", "")])
    replicas = []
    for name in ("a", "b"):
        config = root / f"{name}.yaml"
        config.write_text(json.dumps({
            "budget_meter": "redis", "revocation": "redis", "evidence_sinks": ["postgres"],
            "options": {"budget_redis": {"url": redis_url, "prefix": redis_prefix},
                        "evidence_postgres": {"dsn": pg_dsn, "replica": name},
                        "service_postgres": {"dsn": pg_dsn}}}))
        # --confirmation auto: the built-in consent rule asks for a Process side effect
        replicas.append(Replica(root, name, config, policy, env, "--manifest",
                                str(root / "sleeper.json"), "--confirmation", "auto"))
    try:
        yield replicas, root, env
    finally:
        for r in replicas:
            r.stop()


def _token(root: Path, env: dict[str, str]) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "add",
                           "--tenant", "acme", "--subject", "agent:x", "--config",
                           str(root / "a.yaml"), "--format", "json"], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    return str(data["token"]), str(data["token_id"])


def _op(url: str, token: str, root: Path, call_id: str, calls: int) -> httpx.Response:
    body = {"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"}, "manifest": "reader",
            "grant": grant("acme", "agent:x", root, call_id=call_id, budget={"calls": calls})}
    return httpx.post(f"{url}/v1/ops", json=body, headers={"Authorization": f"Bearer {token}"},
                      timeout=60)


def _verify(pg_dsn: str, replica: str, out: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "plugins.evidence_postgres.export", pg_dsn,
                           replica, str(out)], capture_output=True, text=True, timeout=60,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "evidence", "verify",
                           str(out), "--format", "json"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


def test_two_replicas_share_budgets_revocations_evidence_and_policy(
        cluster: tuple[list[Replica], Path, dict[str, str]], pg_dsn: str, redis_url: str,
        redis_prefix: str) -> None:
    (a, b), root, env = cluster
    token, token_id = _token(root, env)
    urls = [a.url, b.url]
    # 1) one grant's `calls` budget of N: exactly N allowed out of many, across replicas
    for round_, n in enumerate((7, 12)):
        call = f"budget-{round_}"
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i, c=call, n=n: _op(urls[i % 2], token, root, c, n),
                                    range(4 * n)))
        ok = [r for r in answers if r.status_code == 200 and r.json()["result"]["ok"]]
        refused = [r for r in answers if r.status_code != 200]
        assert len(ok) == n, [r.text for r in answers if r not in ok][:3]
        assert {r.json()["error"]["code"] for r in refused} == {"QUOTA.BUDGET_EXCEEDED"}
        assert {urls[i % 2] for i, r in enumerate(answers) if r in ok} == set(urls)
    # 2) a grant revoked in the shared list (what an operator's revoke does) is refused by
    # both replicas at the very next call
    assert _op(b.url, token, root, "rev-1", 100).status_code == 200
    redis.Redis.from_url(redis_url).sadd(f"{redis_prefix}revoked", "rev-1")
    for url in urls:
        refused = _op(url, token, root, "rev-1", 100)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "SANDBOX.PERMISSION_DENY"
        assert "revoked" in refused.text
    # 3) a policy reload reaches both replicas
    policy = root / "shared.sbpolicy"
    policy.write_text(POLICY.format(root=root) + FORBID.format(root=root))
    deadline = time.monotonic() + 20
    pending = set(urls)
    while pending and time.monotonic() < deadline:
        pending = {u for u in pending if _op(u, token, root, "reload", 1000).status_code == 200}
        time.sleep(0.2)
    assert not pending, f"replicas still on the old policy: {pending}"
    policy.write_text(POLICY.format(root=root))
    # 4) every envelope of both replicas is in PostgreSQL, one verifiable chain per replica
    time.sleep(1.0)  # let the reload back settle (evidence is written before each response)
    with psycopg.connect(pg_dsn) as conn:
        counts = dict(conn.execute("SELECT replica, count(*) FROM evidence_records "
                                   "GROUP BY replica").fetchall())
    assert set(counts) == {"a", "b"}
    for name in ("a", "b"):
        report = _verify(pg_dsn, name, root / f"{name}.sqlite", env)
        assert report["ok"] is True
        assert report["records"] == counts[name]
    # 5) a token revoked (through the shared store) is refused by both replicas at once
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "revoke",
                           token_id, "--config", str(root / "a.yaml")], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    for url in urls:
        assert _op(url, token, root, "after-revoke", 100).status_code == 401


def test_concurrency_slots_hold_across_replicas(
        cluster: tuple[list[Replica], Path, dict[str, str]]) -> None:
    (a, b), root, env = cluster
    token, _ = _token(root, env)
    body = {"op": {"kind": "proc.exec", "tool": "sleep", "args": ["2"]}, "manifest": "sleeper",
            "grant": {**grant("acme", "agent:x", root, call_id="slots"),
                      "tool_name": "sleeper",
                      "capabilities": [{"kind": "proc.exec", "tool": "sleep"}]}}
    barrier = threading.Barrier(4)

    def call(url: str) -> httpx.Response:
        barrier.wait()
        return httpx.post(f"{url}/v1/ops", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {token}"})

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, [a.url, b.url, a.url, b.url]))
    ran = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    assert len(ran) == 1, [r.text for r in answers]
    assert ran[0].json()["result"]["ok"] is True, ran[0].text
    assert len(refused) == 3
    assert {r.json()["error"]["code"] for r in refused} == {"QUOTA.BUDGET_EXCEEDED"}
    assert all("concurrency" in r.text for r in refused)
    # the slot came back when the call ended: the other replica runs the next one
    body["op"] = {"kind": "proc.exec", "tool": "sleep", "args": ["0"]}
    again = httpx.post(f"{b.url}/v1/ops", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {token}"})
    assert again.status_code == 200, again.text


def test_a_replica_killed_mid_load_loses_no_completed_calls_evidence(
        cluster: tuple[list[Replica], Path, dict[str, str]], pg_dsn: str, redis_url: str,
        redis_prefix: str) -> None:
    (a, b), root, env = cluster
    token, _ = _token(root, env)
    n = 30
    done: list[httpx.Response] = []
    lock = threading.Lock()

    def hammer(url: str) -> None:
        for _ in range(30):
            try:
                r = _op(url, token, root, "kill-load", n)
            except httpx.TransportError:
                continue  # the killed replica: this call never completed
            with lock:
                done.append(r)

    threads = [threading.Thread(target=hammer, args=(u,)) for u in (a.url, b.url) * 2]
    for t in threads:
        t.start()
    time.sleep(0.7)
    a.proc.kill()  # SIGKILL mid-load
    for t in threads:
        t.join()
    allowed = [r for r in done if r.status_code == 200 and r.json()["result"]["ok"]]
    assert len(allowed) <= n
    # budgets stay exact: what is left is exactly what the killed replica did not use up,
    # so the survivor allows precisely the remainder and then refuses
    rest = [_op(b.url, token, root, "kill-load", n) for _ in range(n)]
    more = sum(1 for r in rest if r.status_code == 200)
    with psycopg.connect(pg_dsn) as conn:
        ends = {e for (e,) in conn.execute(
            "SELECT envelope_id FROM evidence_records WHERE type = 'end'").fetchall()}
        begins = {e for (e,) in conn.execute(
            "SELECT envelope_id FROM evidence_records WHERE type = 'begin'").fetchall()}
    completed = {r.json()["envelope_id"] for r in done + rest if "envelope_id" in r.json()}
    assert completed, "no call completed"
    assert completed <= ends, "a completed call lost its end record"
    assert completed <= begins
    charged_ok = len(allowed) + more
    # every allowed call charged one unit; calls the kill cut off may have charged one too
    # (charged at start, before running): never more than N in total
    # (2 client threads talked to the killed replica: at most 2 calls were cut off)
    assert n - 2 <= charged_ok <= n
    assert rest[-1].json()["error"]["code"] == "QUOTA.BUDGET_EXCEEDED"
    used = redis.Redis.from_url(redis_url).hget(f"{redis_prefix}budget:acme/agent:x/kill-load",
                                                 "calls")
    assert int(used or 0) == n  # spent exactly, never over
    for name in ("a", "b"):
        assert _verify(pg_dsn, name, root / f"kill-{name}.sqlite", env)["ok"] is True


def test_postgres_going_down_answers_503_or_spools_the_evidence(
        tmp_path: Path, redis_url: str, redis_prefix: str, pg_dsn: str) -> None:
    private, stop = start_postgres()  # a cluster of this test's own, to stop
    root = tmp_path / "svc"
    (root / "data").mkdir(parents=True)
    (root / "data" / "hello.txt").write_text("hello\n")
    (root / "reader.json").write_text(json.dumps(manifest(root)))
    policy = root / "shared.sbpolicy"
    policy.write_text(POLICY.format(root=root))
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(entry_points_dir(root / "ep")),
                                         env.get("PYTHONPATH", "")])
    # a: tokens and evidence in the private cluster; b: tokens in the shared one, evidence in
    # the private one
    replicas = []
    try:
        for name, tokens_dsn in (("a", private), ("b", pg_dsn)):
            config = root / f"{name}.yaml"
            config.write_text(json.dumps({
                "budget_meter": "redis", "revocation": "redis", "evidence_sinks": ["postgres"],
                "options": {"budget_redis": {"url": redis_url, "prefix": redis_prefix},
                            "evidence_postgres": {"dsn": private, "replica": name},
                            "service_postgres": {"dsn": tokens_dsn}}}))
            replicas.append(Replica(root, name, config, policy, env))
        a, b = replicas
        token_a = _token_for(root / "a.yaml", env)
        token_b = _token_for(root / "b.yaml", env)
        assert _op(a.url, token_a, root, "down-a", 100).status_code == 200
        assert _op(b.url, token_b, root, "down-b", 100).status_code == 200
        stop()
        refused = _op(a.url, token_a, root, "down-a", 100)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "PROVIDER.UNAVAILABLE"
        assert refused.json()["error"]["retryable"] is True
        assert "service database `postgresql://127.0.0.1:" in a.log.read_text()
        ok = _op(b.url, token_b, root, "down-b", 100)  # evidence down: the call goes on
        assert ok.status_code == 200, ok.text
        spool = root / "b" / "spool" / "postgres.jsonl"
        lines = [json.loads(x) for x in spool.read_text().splitlines()]
        assert [x["type"] for x in lines] == ["begin", "end"]
        assert {x["envelope_id"] for x in lines} == {ok.json()["envelope_id"]}
    finally:
        for r in replicas:
            r.stop()
        stop()


def _token_for(config: Path, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "add",
                           "--tenant", "acme", "--subject", "agent:x", "--config", str(config),
                           "--format", "json"], capture_output=True, text=True, timeout=60,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["token"])


def test_a_hung_redis_fails_closed_without_stalling_the_replica(tmp_path: Path) -> None:
    # a "Redis" that accepts connections and never answers (a blackholed host, a frozen
    # server): each request waits out the client timeout and is refused; meanwhile the
    # replica keeps serving what does not need Redis
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    url = f"redis://127.0.0.1:{hung.getsockname()[1]}/0"
    root = tmp_path
    (root / "data").mkdir()
    (root / "data" / "hello.txt").write_text("hello\n")
    (root / "reader.json").write_text(json.dumps(manifest(root)))
    policy = root / "p.sbpolicy"
    policy.write_text(POLICY.format(root=root))
    config = root / "hung.yaml"
    config.write_text(json.dumps({"budget_meter": "redis", "options": {
        "budget_redis": {"url": url, "timeout_s": 2}}}))
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(entry_points_dir(root / "ep")),
                                         env.get("PYTHONPATH", "")])
    replica = Replica(root, "r", config, policy, env)
    try:
        done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "tokens", "add",
                               "--tenant", "acme", "--subject", "agent:x", "--state-dir",
                               str(root / "r"), "--format", "json"], capture_output=True,
                              text=True, timeout=60, env=env, check=True)
        token = json.loads(done.stdout)["token"]
        with ThreadPoolExecutor(4) as pool:
            slow = [pool.submit(_op, replica.url, token, root, "hung", 10) for _ in range(3)]
            time.sleep(0.3)  # the three are waiting on the hung Redis now
            t0 = time.monotonic()
            health = httpx.get(f"{replica.url}/sandbox/health", timeout=30)
            waited = time.monotonic() - t0
            answers = [f.result() for f in slow]
        assert health.status_code == 200
        assert waited < 1.0, f"the event loop stalled for {waited:.1f} s behind Redis"
        for r in answers:
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "PROVIDER.UNAVAILABLE"
            assert r.json()["error"]["retryable"] is True
    finally:
        replica.stop()
        hung.close()
