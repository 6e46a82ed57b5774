"""A real policy, manifest, grant and request for state-store tests, plus small-tmpfs helpers."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.config import EngineConfig
from policy_engine.model import FsReadOp, Grant, Manifest, Settings
from policy_engine.orchestrator import Orchestrator, RunOutcome


@dataclass(frozen=True, slots=True)
class Fixture:
    """Files for one allowed `fs.read` of ``workspace/README.md`` through the real executor."""

    root: Path
    workspace: Path
    policy: Path
    manifest: Path
    grant: Path
    request: Path

    def cli(self, state_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        """`policy-engine run` in a child process (the real CLI, real plugins)."""
        return subprocess.run(
            [sys.executable, "-m", "policy_engine.cli", "run", "--policy", str(self.policy),
             "--request", str(self.request), "--state-dir", str(state_dir), *extra],
            capture_output=True, text=True, timeout=120, check=False)

    def stats(self, log: Path) -> str:
        """`policy-engine stats LOG`: its text output and errors."""
        done = subprocess.run([sys.executable, "-m", "policy_engine.cli", "stats", str(log)],
                              capture_output=True, text=True, timeout=60, check=False)
        return done.stdout + done.stderr

    def orchestrator(self, state_dir: Path, **config: object) -> Orchestrator:
        """The real orchestrator with every installed plugin (the Python API)."""
        return Orchestrator(compile_files([self.policy]),
                            config=EngineConfig(state_dir=state_dir, **config))  # type: ignore[arg-type]

    def run(self, orch: Orchestrator) -> RunOutcome:
        grant: Grant = load_grant(self.grant)
        manifest: Manifest = load_manifest(self.manifest)
        return orch.run(grant, manifest, FsReadOp(path=f"{self.workspace}/README.md"),
                        settings=Settings(root_fs=str(self.workspace)),
                        now_ms=1_795_000_000_000)


def make_fixture(root: Path) -> Fixture:
    ws = root / "ws"
    ws.mkdir(parents=True)
    (ws / "README.md").write_text("hello from the workspace\n")
    pattern = f"{ws}/**"
    policy = root / "store.sbpolicy"
    policy.write_text(f'policy "t/store" version "1.0.0"\n'
                      f'permit "read-ws" fs.read paths ["{pattern}"]\n')
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps({
        "name": "reader", "version": "1.0", "side_effects": ["Read"], "safety_class": "Low",
        "permissions": [{"kind": "fs.read", "paths": [pattern]}]}))
    grant = root / "grant.json"
    grant.write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:b", "tool_name": "reader", "call_id": "call-0",
        "capabilities": [{"kind": "fs.read", "paths": [pattern]}],
        "expires_at": 4102444800000, "budget": {"calls": 1000}}))
    request = root / "request.json"
    request.write_text(json.dumps({
        "op": {"kind": "fs.read", "path": f"{ws}/README.md"},
        "settings": {"root_fs": str(ws)}, "now_ms": 1795000000000,
        "manifest": manifest.name, "grant": grant.name}))
    return Fixture(root, ws, policy, manifest, grant, request)


@contextmanager
def small_tmpfs(mountpoint: Path, size: str = "64k") -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``mountpoint`` (needs root), unmounted afterwards."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                   check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; returns the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (4096, 1):  # whole pages, then the last partial page byte by byte
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def envelopes(jsonl: Path) -> tuple[dict[str, list[str]], list[int]]:
    """Record types per envelope id, and the (1-based) numbers of lines that do not parse."""
    kinds: dict[str, list[str]] = collections.defaultdict(list)
    bad: list[int] = []
    for n, line in enumerate(jsonl.read_bytes().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            bad.append(n)
            continue
        if record.get("type") == "checkpoint":  # signed at close by default (issue 32 #10)
            continue
        kinds[record["envelope_id"]].append(record["type"])
    return dict(kinds), bad
