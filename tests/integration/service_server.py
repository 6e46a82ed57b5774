"""Starts `policy-engine serve` as a real subprocess on a loopback ephemeral port for tests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

POLICY = """policy "svc/test" version "1.0.0"
permit "read-data" fs.read, fs.list  paths ["{root}/data/**", "{ws}/**", "/workspace/work/**"]
permit "write-ws" fs.write  paths ["{ws}/**", "/workspace/work/**"]
forbid "no-secret" fs.read  paths ["{root}/data/secret/**"]
permit "sh" proc.exec  tool "bash"
permit "py" proc.exec  tool "python3"
require consent when `profile.safety == "High"`
"""


def cli(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args,
                           "--state-dir", str(state)], capture_output=True, text=True,
                          timeout=60, check=False)


def add_token(state: Path, tenant: str, subject: str) -> str:
    """An agent token in the server's ``tokens.sqlite``: what `policy-engine tokens add
    --state-dir` writes, without a CLI start per token (set-up only; the command itself, and a
    server taking the token it printed, are tested in test_service_nonutf8_names.py and
    test_replicas.py)."""
    from policy_engine.tokens import TokenStore

    store = TokenStore(state.absolute() / "tokens.sqlite")
    try:
        token, _info = store.add(tenant, subject, "", "agent")
    finally:
        store.close()
    return token


@dataclass
class Service:
    """A running server: its base URL, state dir, data root and process."""

    url: str
    root: Path
    state: Path
    proc: subprocess.Popen[str]

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def stop(self) -> str:
        """Stop the server; returns what it logged."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return (self.root / "serve.log").read_text()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start(root: Path, *extra: str, policy_text: str = POLICY) -> Service:
    """Write the test policy (``policy_text``, formatted with ``root`` and ``ws``) under
    ``root`` and start the server on a free loopback port."""
    state, ws = root / "state", root / "state" / "workspace"
    (root / "data" / "secret").mkdir(parents=True, exist_ok=True)
    (root / "data" / "hello.txt").write_text("hello\n")
    (root / "data" / "secret" / "key.txt").write_text("k3y\n")
    policy = root / "svc.sbpolicy"
    policy.write_text(policy_text.format(root=root, ws=ws))
    tools = []
    for name, fields in (("reader", {}), ("reader-high", {"safety_class": "High"})):
        path = root / f"{name}.json"
        path.write_text(json.dumps({**manifest(root), "name": name, **fields}))
        tools += ["--manifest", str(path)]
    log = root / "serve.log"
    # stderr goes to a file: a pipe nobody drains would block the server once full
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "policy_engine.cli", "serve", "--policy", str(policy),
             "--state-dir", str(state), "--root-fs", str(root), "--port", "0", *tools,
             *extra],
            stderr=sink, stdout=subprocess.DEVNULL, text=True, env=os.environ.copy())
    deadline = time.monotonic() + 30
    match = None
    while match is None:
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())
        if match is None:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    service = Service(match.group(1), root, state, proc)
    while True:  # the socket is bound before uvicorn serves: wait for the first answer
        try:
            httpx.get(f"{service.url}/sandbox/health", timeout=5)
            return service
        except httpx.TransportError:
            if time.monotonic() > deadline:
                service.stop()
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def serving(root: Path, *extra: str) -> Iterator[Service]:
    """:func:`start`, stopped on exit; the server must not have logged a traceback."""
    with start(root, *extra) as service:
        yield service
    log = (service.root / "serve.log").read_text()
    assert "Traceback" not in log, log


def grant(tenant: str, subject: str, root: Path, **extra: object) -> dict[str, object]:
    return {"tenant": tenant, "subject_id": subject, "tool_name": "reader", "call_id": "c-1",
            "expires_at": 4102444800000,
            "capabilities": [{"kind": "fs.read", "paths": [f"{root}/data/**"]}], **extra}


def manifest(root: Path) -> dict[str, object]:
    return {"name": "reader", "version": "1.0.0", "side_effects": ["Read"],
            "permissions": [{"kind": "fs.read", "paths": [f"{root}/**"]}]}


def dumps(data: object) -> str:
    return json.dumps(data)
