"""`policy-engine serve --workers 2` as a real subprocess: both workers serve, a revoked token
and the rate limit and the exec cap hold in every worker, a dead worker is reported and
replaced, SIGTERM lets a request in flight finish and stops every worker, and workers never
outlive a killed parent. Which worker holds a connection is read from /proc (the socket's
inode), not from anything the service says."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from policy_engine.service.slots import ExecSlots
from tests.integration.service_server import Service, add_token, cli, grant, start

pytestmark = pytest.mark.integration


def _workers(svc: Service) -> set[int]:
    """The live (not zombie) child processes of the server."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == svc.proc.pid and stat[0] != "Z":
            found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _owner(pids: set[int], server_port: int, client_port: int) -> int | None:
    """The process holding the server side of the loopback connection from ``client_port``."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if (int(local.split(":")[1], 16) == server_port
                and int(remote.split(":")[1], 16) == client_port):
            inode = fields[9]
    if inode is None:
        return None
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:  # one fd closing while the others are read must not hide the whole process
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


class Conn:
    """One keep-alive HTTP/1.1 connection (raw, so its port and owner are known)."""

    def __init__(self, svc: Service) -> None:
        host, port = svc.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.file = self.sock.makefile("rb")

    def request(self, method: str, path: str, token: str | None = None,
                body: object = None) -> tuple[int, dict[str, object]]:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(data)}\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + data)
        status = int(self.file.readline().split()[1])
        length = 0
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, json.loads(self.file.read(length))

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _by_worker(svc: Service) -> dict[int, Conn]:
    """A keep-alive connection owned by each worker. Found with `/sandbox/health` (no token,
    no rate limit); a worker still starting up accepts nothing yet, so this waits for it."""
    port = int(svc.url.rsplit(":", 1)[1])
    pids = _workers(svc)
    owned: dict[int, Conn] = {}
    deadline = time.monotonic() + 30
    while len(owned) < len(pids) and time.monotonic() < deadline:
        conn = Conn(svc)
        status, _ = conn.request("GET", "/sandbox/health")
        assert status == 200
        owner = _owner(pids, port, conn.sock.getsockname()[1])
        assert owner in pids, (owner, pids)
        if owner in owned:
            conn.close()
            time.sleep(0.05)
        else:
            owned[owner] = conn
    return owned


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start(tmp_path_factory.mktemp("workers"), "--workers", "2", "--rate-per-minute", "12",
               "--max-concurrent-execs", "1") as service:
        yield service
    assert "Traceback" not in (service.root / "serve.log").read_text()


def test_both_workers_serve_and_a_revoked_token_is_refused_by_each(svc: Service) -> None:
    assert len(_workers(svc)) == 2
    token = add_token(svc.state, "rev", "agent:r")
    owned = _by_worker(svc)
    assert len(owned) == 2, "one worker never accepted a connection"

    def ops(conn: Conn) -> None:
        for i in range(3):
            status, body = conn.request("POST", "/v1/ops", token, {
                "op": {"kind": "fs.read", "path": f"{svc.root}/data/hello.txt"},
                "grant": grant("rev", "agent:r", svc.root,
                               call_id=f"c-{conn.sock.fileno()}-{i}"),
                "manifest": "reader"})
            assert status == 200, body

    both = [threading.Thread(target=ops, args=(conn,)) for conn in owned.values()]
    for t in both:
        t.start()
    for t in both:
        t.join(60)
    # both workers appended to the one evidence log: the chain is still whole
    verified = subprocess.run([sys.executable, "-m", "policy_engine.cli", "evidence", "verify",
                               str(svc.state / "evidence" / "evidence.jsonl")],
                              capture_output=True, text=True, timeout=60, check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    done = cli("tokens", "revoke", token.removeprefix("pet_").split(".")[0], state=svc.state)
    assert done.returncode == 0, done.stderr
    for conn in owned.values():  # the very connections each worker served a moment ago
        status, body = conn.request("GET", "/sandbox/execs", token)
        assert status == 401, body
        assert body["error"]["code"] == "AUTH.UNAUTHENTICATED"  # type: ignore[index]
    for conn in owned.values():
        conn.close()


def test_the_rate_limit_is_shared_by_the_workers(svc: Service) -> None:
    for _ in range(2):  # a second try if a minute boundary split the burst
        token = add_token(svc.state, f"busy{int(time.time())}", "agent:b")
        conns = list(_by_worker(svc).values())
        assert len(conns) == 2
        window = int(time.time() // 60)
        statuses = [conns[i % 2].request("GET", "/sandbox/execs", token)[0] for i in range(16)]
        for conn in conns:
            conn.close()
        if int(time.time() // 60) == window:
            break
    # 12 a minute for the tenant, whichever worker counts them (alternating here)
    assert statuses == [200] * 12 + [429] * 4, statuses


def test_the_exec_cap_holds_across_workers(svc: Service) -> None:
    token = add_token(svc.state, "cap", "agent:c")
    owned = _by_worker(svc)
    assert len(owned) == 2
    spans: list[tuple[float, float]] = []

    def run(conn: Conn) -> None:
        status, rec = conn.request("POST", "/sandbox/execs", token, {
            "project_id": "cap", "exec": {
                "kind": "shell", "script": "date +%s.%N; sleep 0.6; date +%s.%N"}})
        assert status == 200, rec
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"}) as c:
            out = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/stdout.txt").text
        first, last = (float(x) for x in out.split())
        spans.append((first, last))

    threads = [threading.Thread(target=run, args=(conn,)) for conn in owned.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 2
    spans.sort()
    assert spans[1][0] >= spans[0][1], spans  # --max-concurrent-execs 1 in both workers
    for conn in owned.values():
        conn.close()


def test_a_dead_worker_is_replaced_and_sigterm_finishes_the_request_in_flight(
        tmp_path: Path) -> None:
    svc = start(tmp_path, "--workers", "2")
    try:
        token = add_token(svc.state, "acme", "agent:a")
        victim = min(_workers(svc))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while (len(_workers(svc) - {victim}) < 2 or _alive(victim)) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        workers = _workers(svc)
        assert victim not in workers, workers
        assert len(workers) == 2, workers
        log = (tmp_path / "serve.log").read_text()
        assert f"(pid {victim}) was killed by SIGKILL; starting another" in log, log

        result: dict[str, object] = {}

        def slow() -> None:
            with svc.client(token) as c:
                resp = c.post("/v1/ops", json={
                    "op": {"kind": "fs.read", "path": f"{tmp_path}/data/hello.txt"},
                    "grant": grant("acme", "agent:a", tmp_path), "manifest": "reader"})
                result["ops"] = resp.status_code
                resp = c.post("/sandbox/execs", json={"project_id": "p", "exec": {
                    "kind": "shell", "script": "sleep 1.5; echo finished"}})
                result["status"], result["body"] = resp.status_code, resp.json()

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(1.0)  # the exec is running
        svc.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert svc.proc.wait(timeout=30) == 0
        assert result["ops"] == 200
        assert result["status"] == 200, result
        assert result["body"]["status"] == "ok", result  # type: ignore[index]
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), "a worker outlived the server"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{svc.url}/sandbox/health", timeout=2)
        log = (tmp_path / "serve.log").read_text()
        assert "Traceback" not in log
        assert "while stopping" not in log, log  # every worker stopped as told
    finally:
        svc.stop()


def test_workers_do_not_outlive_a_killed_parent(tmp_path: Path) -> None:
    svc = start(tmp_path, "--workers", "2")
    try:
        workers = _workers(svc)
        assert len(workers) == 2
        svc.proc.kill()  # no chance to forward anything
        svc.proc.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), "orphaned workers kept serving"
    finally:
        svc.stop()


def test_per_process_state_is_refused_with_several_workers(tmp_path: Path) -> None:
    config = tmp_path / "engine.json"
    config.write_text(json.dumps({"budget_meter": "memory"}))
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "p" version "1.0.0"\n')
    done = cli("serve", "--policy", str(policy), "--config", str(config), "--workers", "2",
               "--port", "0", state=tmp_path / "state")
    assert done.returncode == 2, done.stderr
    assert "budget_meter: memory" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_exec_slot_held_by_a_killed_process_is_free_again(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; "
            "from policy_engine.service.slots import ExecSlots\n"
            "with ExecSlots(Path(sys.argv[1]), 1).hold():\n"
            "    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        slots = ExecSlots(tmp_path, 1)
        taken: list[float] = []

        def take() -> None:
            with slots.hold():
                taken.append(time.monotonic())

        waiter = threading.Thread(target=take)
        waiter.start()
        time.sleep(0.5)
        assert taken == [], "a second holder got the only slot"
        killed_at = time.monotonic()
        holder.kill()  # no release: the kernel drops the lock with the process
        waiter.join(10)
        assert taken, "the slot stayed taken after its holder died"
        assert taken[0] >= killed_at
    finally:
        holder.kill()
        holder.wait()


def test_hot_reload_reaches_every_worker(tmp_path: Path) -> None:
    with start(tmp_path, "--workers", "2", "--reload-interval", "0.2") as svc:
        token = add_token(svc.state, "acme", "agent:a")
        owned = _by_worker(svc)
        assert len(owned) == 2
        body = {"op": {"kind": "fs.read", "path": f"{tmp_path}/data/hello.txt"},
                "grant": grant("acme", "agent:a", tmp_path), "manifest": "reader"}

        def decisions() -> list[str]:
            return [str(conn.request("POST", "/v1/decide", token, body)[1]["decision"])
                    for conn in owned.values()]

        assert decisions() == ["allow", "allow"]
        policy = tmp_path / "svc.sbpolicy"
        policy.write_text(policy.read_text() + f'forbid "now-closed" fs.read  paths '
                          f'["{tmp_path}/data/hello.txt"]\n')
        deadline = time.monotonic() + 15
        while decisions() != ["deny", "deny"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert decisions() == ["deny", "deny"]  # each worker reloaded on its own
        for conn in owned.values():
            conn.close()


def test_workers_that_keep_dying_stop_the_server(tmp_path: Path) -> None:
    """A worker that cannot start is not forked forever: past 5 deaths a minute the
    supervisor stops (exit 1) and says why. Real forks, in a process of their own."""
    code = ("import socket, sys\n"
            "from policy_engine.service.prefork import serve_workers\n"
            "sock = socket.create_server(('127.0.0.1', 0))\n"
            "sys.exit(serve_workers(sock, 2, lambda index: 3, print))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum("exited with status 3; starting another" in line for line in lines) == 5, lines
    stops = [line for line in lines if "workers died within 60 s; stopping the server" in line]
    assert len(stops) == 1, lines  # and the worker still running was stopped, not replaced
