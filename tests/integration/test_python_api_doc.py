"""docs/python-api.md's first example runs as written (a real bubblewrap sandbox) and prints
what its comments say: the documented API is the one that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_the_documented_example_runs() -> None:
    text = (REPO / "docs" / "python-api.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S)
    assert example is not None
    done = subprocess.run([sys.executable, "-c", example.group(1)], capture_output=True,
                          text=True, timeout=120, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "42"
    assert lines[1] == "proc-bwrap"
    assert re.fullmatch(r"[0-9a-f]{32}", lines[2])  # the evidence envelope of the run
    code, refused_by = lines[3].split()
    assert code in ("SANDBOX.PERMISSION_DENY", "POLICY.DENY_TOOL")
    assert refused_by in ("grant", "policy", "manifest")
    assert re.fullmatch(r"[0-9a-f]{32}", lines[4])
    assert lines[4] != lines[2]
