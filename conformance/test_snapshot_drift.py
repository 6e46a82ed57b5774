"""Snapshot drift: a changed decision, a missing and an orphan snapshot each fail a run.

Runs pytest in a subprocess over a temporary copy of the case runner (``casekit.py``,
``conftest.py`` and ``test_cases.py``, minus its whole-suite coverage section) with one real
case and its real snapshot, then changes or removes the pinned snapshot. The orphan check runs
the complete copied suite (every case and snapshot, plus one orphan): syrupy decides "unused"
over a whole run, which is what `pytest conformance` and the CI command are.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.pytest_child import WITHOUT_UNUSED

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOTE = "fs/read-workspace-file"
SNAP = f"test_case[{NOTE.replace('/', '.')}].json"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the runner with one case, laid out as in the repository."""
    conf = tmp_path / "conformance"
    (conf / "cases" / "fs").mkdir(parents=True)
    (conf / "__snapshots__" / "test_cases").mkdir(parents=True)
    for name in ("casekit.py", "conftest.py"):
        shutil.copy(HERE / name, conf / name)
    runner = (HERE / "test_cases.py").read_text()
    cut, resume = runner.index("# ---- the suite's own coverage"), runner.index("# ---- malformed")
    (conf / "test_cases.py").write_text(runner[:cut] + runner[resume:])
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    source = (HERE / "cases" / "fs" / "read.yaml").read_text()
    start = source.index(f"  - note: {NOTE}\n")
    end = source.index("  - note:", start + 1)
    (conf / "cases" / "fs" / "one.yaml").write_text("cases:\n" + source[start:end])
    shutil.copy(HERE / "__snapshots__" / "test_cases" / SNAP,
                conf / "__snapshots__" / "test_cases" / SNAP)
    return tmp_path


def run(project: Path) -> subprocess.CompletedProcess[str]:
    # the engine under test is this checkout's (after the copy, before the caller's
    # PYTHONPATH): without it the child imported whichever tree the editable install points
    # at, another checkout's engine for a worktree
    paths = [str(project), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    # a session of its own, not one more xdist worker of ours (syrupy would defer its report)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")},
           "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *WITHOUT_UNUSED,
         "--rootdir",
         str(project), "-c", os.devnull, "conformance/test_cases.py"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120)


def test_pinned_snapshot_passes_then_a_changed_decision_fails(project: Path) -> None:
    clean = run(project)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "snapshot passed" in clean.stdout

    snap = project / "conformance" / "__snapshots__" / "test_cases" / SNAP
    pinned = json.loads(snap.read_text())
    # the decision changing (another code, another rule) is what a contract drift looks like
    drifted = {**pinned, "code": "SANDBOX.PERMISSION_DENY", "decision": "deny"}
    snap.write_text(json.dumps(drifted, indent=2, sort_keys=True) + "\n")
    changed = run(project)
    assert changed.returncode == 1, changed.stdout
    assert f"test_case[{NOTE.replace('/', '.')}]" in changed.stdout
    assert "SANDBOX.PERMISSION_DENY" in changed.stdout  # the diff shows what changed



def test_orphan_snapshot_fails_a_full_run(tmp_path: Path) -> None:
    conf = tmp_path / "conformance"
    conf.mkdir()
    for name in ("casekit.py", "conftest.py", "test_cases.py"):
        shutil.copy(HERE / name, conf / name)
    shutil.copytree(HERE / "cases", conf / "cases")
    shutil.copytree(HERE / "__snapshots__" / "test_cases", conf / "__snapshots__" / "test_cases")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    kept = conf / "__snapshots__" / "test_cases" / SNAP
    kept.with_name("test_case[fs.case-that-was-removed].json").write_text(kept.read_text())
    unused = run(tmp_path)
    assert unused.returncode == 1, unused.stdout[-2000:]
    assert " failed" not in unused.stdout  # every case still holds: the orphan fails the run
    assert "1 snapshot unused" in unused.stdout


def test_missing_snapshot_fails_without_update(project: Path) -> None:
    snap = project / "conformance" / "__snapshots__" / "test_cases" / SNAP
    snap.unlink()
    missing = run(project)
    assert missing.returncode == 1, missing.stdout
    assert "1 failed" in missing.stdout
    assert "snapshot does not exist" in missing.stdout.lower() or "1 snapshot failed" in \
        missing.stdout
