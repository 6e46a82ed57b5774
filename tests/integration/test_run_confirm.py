"""`policy-engine run --confirm interactive` asks on a real terminal (a pty) when consent is
needed and the grant has none; `--confirm deny` (the default) leaves the call denied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _files(tmp: Path) -> list[str]:
    (tmp / "data").mkdir()
    (tmp / "data" / "notes.private").write_text("private notes\n")
    (tmp / "p.sbpolicy").write_text(
        'policy "confirm/cli" version "1.0.0"\n'
        f'permit "read" fs.read  paths ["{tmp}/data/**"]\n'
        'require consent when `request.path.endsWith(".private")`\n')
    (tmp / "m.json").write_text(json.dumps({
        "name": "reader", "version": "1", "side_effects": ["Read"],
        "permissions": [{"kind": "fs.read", "paths": [f"{tmp}/**"]}]}))
    (tmp / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:a", "tool_name": "reader", "call_id": "c-1",
        "expires_at": 4102444800000,
        "capabilities": [{"kind": "fs.read", "paths": [f"{tmp}/data/**"]}]}))
    (tmp / "r.json").write_text(json.dumps({
        "op": {"kind": "fs.read", "path": f"{tmp}/data/notes.private"},
        "settings": {"root_fs": str(tmp)}}))
    return [sys.executable, "-m", "policy_engine.cli", "run", "--policy", str(tmp / "p.sbpolicy"),
            "--manifest", str(tmp / "m.json"), "--grant", str(tmp / "g.json"),
            "--request", str(tmp / "r.json"), "--state-dir", str(tmp / "state")]


def test_interactive_yes_on_a_terminal_runs_the_call(tmp_path: Path) -> None:
    argv = _files(tmp_path)
    master, slave = os.openpty()
    os.write(master, b"y\n")
    try:
        done = subprocess.run([*argv, "--confirm", "interactive", "--format", "json"],
                              stdin=slave, capture_output=True, text=True, timeout=60,
                              check=False)
    finally:
        os.close(slave)
        os.close(master)
    assert done.returncode == 0, done.stderr
    assert "consent needed" in done.stderr  # the prompt went to the terminal user
    assert json.loads(done.stdout)["result"]["ok"] is True
    record = json.loads((tmp_path / "state" / "consent.jsonl").read_text())
    assert record["answer"]["approver"] == "terminal"
    assert record["answer"]["mode"] == "interactive"
    assert record["envelope_id"] == json.loads(done.stdout)["envelope_id"]


def test_without_a_confirmation_the_call_stays_denied(tmp_path: Path) -> None:
    argv = _files(tmp_path)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert "SANDBOX.PERMISSION_DENY" in done.stdout
    assert "consent required" in done.stdout
    # interactive without a terminal is a no as well
    again = subprocess.run([*argv, "--confirm", "interactive"], capture_output=True,
                           text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert again.returncode == 1
