"""`policy-engine run` of one call on a chosen process backend, for the integration tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_on_backend(tmp: Path, backend: str, *, policy: str, manifest: str,
                   grant: dict[str, Any], argv: tuple[str, ...]) -> tuple[int, dict[str, Any]]:
    """Run ``argv`` as a proc.exec under ``policy`` on ``backend`` (compat mode: landlock,
    local and docker lack some of bwrap's isolation; mandatory denies never degrade); the
    exit code and the JSON printed. No traceback may reach stderr."""
    (tmp / "p.sbpolicy").write_text(policy)
    (tmp / "m.sbpolicy").write_text(manifest)
    (tmp / "g.json").write_text(json.dumps(grant))
    (tmp / "c.yaml").write_text(f"state_dir: {tmp / 'state'}\nmode: compat\n"
                                f"backends:\n  proc.exec: {backend}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--policy", str(tmp / "p.sbpolicy"),
         "--manifest", str(tmp / "m.sbpolicy"), "--grant", str(tmp / "g.json"),
         "--config", str(tmp / "c.yaml"), "--format", "json", "--", *argv],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)
