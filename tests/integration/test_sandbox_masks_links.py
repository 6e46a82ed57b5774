"""The sandbox masks a secret under every name it can be reached by (outsider round 11, F2).

Masks were planned from the deny globs as spelt while the binds came from the permits: with
HOME given through a symlink, a forbid's prefix spelt through one, or the permit (and root) spelt
through one, a permitted `cat` in proc-bwrap printed the real key. Run for real through
`policy-engine run` (the CLI, bubblewrap), as the attacker did; the planted bytes must never
appear, and the baseline with every path real is masked as before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KEY, PRIVATE = "PLANTED-KEY-a41c", "PLANTED-PRIV-a41c"
CAPS = [{"kind": "proc.exec", "tool": "cat"}, {"kind": "fs.read", "paths": ["/**"]}]


@pytest.fixture
def base() -> Iterator[Path]:
    # outside /tmp (each sandbox gets its own /tmp), world-readable: only the masks protect
    top = Path(tempfile.mkdtemp(prefix="pe-links-", dir="/var/tmp"))
    real = top / "home" / "alice"
    for d in (".ssh", "private"):
        (real / d).mkdir(parents=True)
    (real / ".ssh" / "id_ed25519").write_text(KEY)
    (real / "private" / "n.txt").write_text(PRIVATE)
    (real / "ok.txt").write_text("fine")
    os.symlink("home", top / "homelink")
    os.symlink("home/alice", top / "alicelink")
    for p in [top, *top.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    (top / "m.json").write_text(json.dumps({
        "name": "sh", "version": "1.0.0", "permissions": CAPS,
        "side_effects": ["Process", "Read"], "safety_class": "Low"}))
    (top / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:x", "tool_name": "sh", "call_id": "c1",
        "capabilities": CAPS, "expires_at": 4102444800000,
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4102444800000}}))
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _cat(top: Path, *, home: str, root: str, forbid: str, target: str) -> str:
    (top / "p.sbpolicy").write_text(f'''policy "links" version "1.0.0"
defaults {{ timeout 20s  network off }}
permit "cat" proc.exec tool "cat"
permit "rd" fs.read, fs.list paths ["{root}/**"]
forbid "priv" fs.read paths ["{forbid}/private/**"]
''')
    (top / "r.json").write_text(json.dumps({
        "op": {"kind": "proc.exec", "tool": "cat", "args": [target], "cwd": root},
        "settings": {"root_fs": root}, "manifest": "m.json", "grant": "g.json"}))
    env = {**os.environ, "HOME": home, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--policy", "p.sbpolicy",
         "--request", "r.json", "--state-dir", "state", "--format", "json"],
        cwd=top, env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)["result"]
    return json.dumps(result)


@pytest.mark.parametrize("case", ["baseline", "home-link", "root-link", "forbid-link"])
def test_secrets_stay_masked_whatever_link_spells_them(base: Path, case: str) -> None:
    real, link = base / "home" / "alice", base / "homelink" / "alice"
    home, root, forbid = str(real), str(real), str(real)
    if case == "home-link":
        home = str(link)
    elif case == "root-link":
        root = str(link)
    elif case == "forbid-link":
        forbid = str(base / "alicelink")
    for target in (f"{root}/.ssh/id_ed25519", f"{root}/private/n.txt"):
        out = _cat(base, home=home, root=root, forbid=forbid, target=target)
        assert KEY not in out, (case, target, out[:400])
        assert PRIVATE not in out, (case, target, out[:400])
    # the masks hide the secrets, not the rest of the tree
    out = _cat(base, home=home, root=root, forbid=forbid, target=f"{root}/ok.txt")
    assert "fine" in out, (case, out[:400])
