"""Evidence survives SIGKILL: every record written before the kill is whole and parses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policy_engine.evidence.verify import verify_records

pytestmark = pytest.mark.integration

UNIT = Path(__file__).parents[1] / "unit"

# The child runs the real orchestrator (JSONL sink, SQLite budget meter) as fast as it can and
# reports each finished call on stdout only after run() returned, i.e. after end was written
# (default fsync policy `interval`: the kernel holds a written record through SIGKILL).
CHILD = """
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from orchestrator_fixtures import MANIFEST, ScriptedExecutor, grant, orchestrator
from policy_engine.model import TmpAllocOp

orch = orchestrator(Path(sys.argv[1]), ScriptedExecutor(), budget_meter="sqlite")
i = 0
while True:
    out = orch.run(grant(f"c{i}"), MANIFEST, TmpAllocOp(size_bytes=i))
    print(out.envelope_id, flush=True)
    i += 1
"""


def test_sigkill_mid_run_loses_no_completed_record(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(UNIT)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    completed: list[str] = []
    deadline = time.monotonic() + 60
    while len(completed) < 200 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        completed.append(line.strip())
    os.kill(child.pid, signal.SIGKILL)  # mid-run: the child is always inside some call
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert len(completed) >= 200

    raw = (tmp_path / "evidence" / "evidence.jsonl").read_bytes()
    assert raw.endswith(b"\n")  # one write() per record: no torn tail even under SIGKILL
    records = [json.loads(line) for line in raw.splitlines()]  # every line parses
    ends = {r["envelope_id"] for r in records if r["type"] == "end"}
    begins = [r["envelope_id"] for r in records if r["type"] == "begin"]
    assert set(completed) <= ends  # every call reported finished has its end on disk
    assert ends <= set(begins)  # and every end has its begin before it
    assert len(begins) - len(ends) <= 1  # at most the one call cut off by the kill
    chain = verify_records(raw.splitlines())  # and the chain survived the kill unbroken
    assert chain.ok, chain.problems
