"""A workspace, policy and skills for the MCP tests, and the evidence they leave."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from tests.integration.service_server import add_token

REPO = Path(__file__).resolve().parents[2]

POLICY = """policy "mcp/test" version "1.0.0"
defaults {{ network restricted }}
permit "read-inputs" fs.read, fs.list  paths ["{root}/inputs/**", "/workspace/**"]
permit "write-work" fs.write  paths ["/workspace/work/**", "/workspace/artifacts/**"]
forbid "no-secret" fs.read  paths ["{root}/inputs/secret/**"]
permit "sh" proc.exec  tool "bash"
permit "py" proc.exec  tool "python3"
require consent when `profile.safety == "High"`
"""


@dataclass
class Setup:
    """Where a test's policy, skills, data and state live."""

    root: Path
    policy: Path
    skills: Path
    state: Path

    def mcp_args(self, *extra: str) -> list[str]:
        return ["-m", "policy_engine.cli", "mcp", "--policy", str(self.policy),
                "--skills", str(self.skills), "--state-dir", str(self.state),
                "--root-fs", str(self.root), *extra]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", str(REPO))
        return env

    def evidence(self) -> list[dict[str, Any]]:
        """Every evidence record written so far (begin and end)."""
        records = []
        for path in self.state.rglob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip().startswith("{"):
                    records.append(json.loads(line))
        return records

    def ends(self, envelope_id: str) -> list[dict[str, Any]]:
        return [r for r in self.evidence()
                if r.get("type") == "end" and r.get("envelope_id") == envelope_id]

    def add_token(self, tenant: str, subject: str) -> str:
        return add_token(self.state, tenant, subject)  # set-up: no CLI start per token


def make_setup(root: Path, extra_policy: str = "") -> Setup:
    (root / "inputs" / "secret").mkdir(parents=True)
    (root / "inputs" / "hello.txt").write_text("hello\n")
    (root / "inputs" / "secret" / "key.txt").write_text("k3y\n")
    policy = root / "mcp.sbpolicy"
    policy.write_text(POLICY.format(root=root) + extra_policy)
    skills = root / "skills"
    shutil.copytree(REPO / "skills", skills)
    return Setup(root, policy, skills, root / "state")


# A shell skill's script that runs until it is stopped, appending to ``name`` in its work
# directory ten times a second. A cancellation test waits for the file (the process runs),
# cancels, and then checks that it stopped growing: a process left running keeps writing, so
# the check fails within a tenth of a second of it, rather than after a fixed sleep longer
# than a `sleep N && echo late` script's N.
BEAT_SCRIPT = "while :; do echo . >> {name}; sleep 0.1; done"


async def wait_for_beat(state: Path, name: str, timeout_s: float = 60) -> Path:
    """The heartbeat file ``name`` under ``state``'s project work directories once it has
    content: the script is running. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for found in state.rglob(name):
            if found.stat().st_size > 0:
                return found
        await anyio.sleep(0.05)
    raise AssertionError(f"no `{name}` under {state} within {timeout_s} s: the script never ran")


async def assert_beat_stopped(beat: Path, grace_s: float = 0.5, quiet_s: float = 1.5) -> None:
    """``beat`` does not grow for ``quiet_s`` (fifteen beats of a running script) from
    ``grace_s`` on (a kill lagging its end record under load; the `sleep N && echo late` form
    this replaced let a process live for seconds past it unnoticed)."""
    await anyio.sleep(grace_s)
    size = beat.stat().st_size
    await anyio.sleep(quiet_s)
    assert beat.stat().st_size == size, f"{beat} still grows: the process was not stopped"
