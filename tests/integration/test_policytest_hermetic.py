"""Policy tests are hermetic (issue 26, item 2): the examples' policy tests give the same results
on a machine without ``/workspace``, with an empty one and with one whose files would change
every fs fact (a directory where a file is read, a file where a write must not overwrite, a
symlink out of the workspace, a large file), each run in a mount namespace of its own.

Run for real: ``unshare -m`` as root, a fresh root assembled from the host's top-level trees
(bind mounts) plus a ``/workspace`` of the test's making, ``chroot`` into it, then the real CLI
with ``--format json``. Nothing of the host's ``/`` is changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "policies"

# a /workspace whose every fact differs from what the cases assume on an empty machine
POPULATE = """
mkdir -p "$ROOT/workspace/src/app.py" "$ROOT/workspace/work/release" "$ROOT/workspace/deploy"
printf 'x' > "$ROOT/workspace/work/notes.md"
printf 'v' > "$ROOT/workspace/work/release/v1.txt"
ln -s /etc "$ROOT/workspace/app"
ln -s / "$ROOT/workspace/work/up"
head -c 30000000 /dev/zero > "$ROOT/workspace/data.bin"
"""

SCRIPT = """
set -eu
ROOT="$1"; MODE="$2"; shift 2
mount -t tmpfs -o size=200m tmpfs "$ROOT"
for entry in /*; do
  name="${entry#/}"
  [ "$name" = workspace ] && continue
  if [ -L "$entry" ]; then ln -s "$(readlink "$entry")" "$ROOT/$name"
  elif [ -d "$entry" ]; then mkdir "$ROOT/$name"; mount --rbind "$entry" "$ROOT/$name"
  fi
done
mkdir "$ROOT/workspace"
if [ "$MODE" = populated ]; then
%s
fi
exec chroot "$ROOT" sh -c 'cd "$0" && exec "$@"' "$PWD" "$@"
""".replace("%s", textwrap.indent(POPULATE, "  "))


def _run_in_namespace(tmp: Path, mode: str) -> dict[str, object]:
    root = tmp / f"root-{mode}"
    root.mkdir()
    cli = [sys.executable, "-c", "import sys; from policy_engine.cli.main import main; "
           "sys.argv[0] = 'policy-engine'; main()", "test", "--format", "json",
           str(EXAMPLES)]
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT, "sh", str(root), mode,
         *cli],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def _outcomes(report: dict[str, object]) -> list[tuple[str, str, str | None, str | None]]:
    files = report["files"]
    assert isinstance(files, list)
    assert files
    cases = [c for f in files for c in f["cases"]]
    assert len(cases) >= 29
    return sorted((c["name"], c["status"], (c.get("actual") or {}).get("decision"),
                   (c.get("actual") or {}).get("code")) for c in cases)


def test_examples_decide_the_same_with_an_empty_and_a_populated_workspace(
        tmp_path: Path) -> None:
    assert os.geteuid() == 0, "run as root: `unshare -m` makes the mount namespaces"
    assert shutil.which("unshare")
    assert shutil.which("chroot")
    empty = _run_in_namespace(tmp_path, "empty")
    populated = _run_in_namespace(tmp_path, "populated")
    assert _outcomes(empty) == _outcomes(populated)
    assert all(status == "passed" for _, status, _, _ in _outcomes(populated)), \
        [o for o in _outcomes(populated) if o[1] != "passed"]
