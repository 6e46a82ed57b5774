"""Never change the ownership of the user's files (issue 26, item 5).

A repository owned by a non-root user (uid 1000 here, as a developer's checkout run through
``sudo`` is), a policy permitting writes in it, and a tool that edits one file and creates
another, run for real by a root engine through the CLI on proc-bwrap, proc-landlock,
proc-unshare, the local runner and Docker. Afterwards every file of the repository still
belongs to its owner, the new file too, and the owner's ``git status`` works. Before the fix the
sandbox ran as uid 65533, which could not write the owner's tree (the write failed); a tree
root owned was handed to 65533 (``chown``), after which host git refused it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_backend_refusal_decision import _cli

pytestmark = pytest.mark.integration

OWNER = (1000, 1000)
EDIT = ("import pathlib, sys; r = pathlib.Path(sys.argv[1]); "
        "(r / 'a.txt').write_text('edited'); (r / 'sub' / 'new.txt').write_text('new'); "
        "print('WROTE')")


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory every user may search (pytest's own is root's 0700): the owner's git
    must reach the repository."""
    where = Path(tempfile.mkdtemp(prefix="pe-identity-", dir="/tmp"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _repo(tmp_path: Path, owner: tuple[int, int] = OWNER) -> Path:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "a.txt").write_text("a")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, *owner)
    return repo


def _as_owner(*argv: str, home: Path, owner: tuple[int, int] = OWNER
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={owner[0]}", f"--regid={owner[1]}",
                           "--clear-groups", *argv], capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=False,
                          timeout=60)


def _args(tmp_path: Path, repo: Path, backend: str) -> list[str]:
    docker = backend == "docker"
    target = "/workspace/work" if docker else str(repo)
    # the container writes its own workspace, never a host tree of the user's
    code = EDIT.replace("r / 'sub' / 'new.txt'", "r / 'new.txt'") if docker else EDIT
    policy = f"""policy "identity" version "1.0.0"
defaults {{ timeout 30s  network off }}
permit "py" proc.exec tool "python3"
permit "rw" fs.read, fs.write paths ["{repo}/**"]
require consent when `false`
"""
    (tmp_path / "p.sbpolicy").write_text(policy)
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "fs.read", "paths": [f"{repo}/**"]},
             {"kind": "fs.write", "paths": [f"{repo}/**"]}]
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "edit", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Process", "Write"], "safety_class": "Low"}))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "acme", "subject_id": "agent:x", "tool_name": "edit", "call_id": "c1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 100}}))
    op = {"kind": "proc.exec", "tool": "python3", "args": ["-c", code, target]}
    (tmp_path / "req.json").write_text(json.dumps({
        "op": op, "settings": {"root_fs": str(repo) if not docker else "/workspace"}}))
    (tmp_path / "engine.yaml").write_text(
        # compat: proc-landlock, proc-unshare and local lack bind mounts (recorded degraded)
        f"state_dir: {tmp_path / 'state'}\nmode: compat\nbackends: {{proc.exec: {backend}}}\n")
    return ["--config", str(tmp_path / "engine.yaml"), "--policy", str(tmp_path / "p.sbpolicy"),
            "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
            "--request", str(tmp_path / "req.json")]


@pytest.mark.parametrize("owner", [OWNER, (0, 0)], ids=["user-owned", "root-owned"])
@pytest.mark.parametrize("backend", ["proc-bwrap", "proc-landlock", "proc-unshare", "local",
                                     "docker"])
def test_a_permitted_write_keeps_every_owner(tmp_path: Path, place: Path, backend: str,
                                            owner: tuple[int, int]) -> None:
    """A user-owned tree is written as its owner; a root-owned one (an engine run as root on a
    root checkout: CI, containers) through an id-mapped bind, the sandbox still the unprivileged
    `run_as`: no owner changes either way, new files are the tree owner's, and the owner's git
    (root's with no `safe.directory`) still reads the repository."""
    assert os.geteuid() == 0, "the engine must be root: that is when ownership was changed"
    repo = _repo(place, owner)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, *owner)
    ran = _cli("run", *_args(tmp_path, repo, backend), "--format", "json")
    out = json.loads(ran.stdout)
    assert out["result"]["ok"] is True, out["result"]
    assert out["result"]["out"]["stdout"].strip() == "WROTE", out["result"]
    assert "owner_changes" not in out["result"]["out"], out["result"]["out"]
    assert "chown" not in json.dumps(out["result"]), out["result"]
    if backend != "docker":
        assert (repo / "a.txt").read_text() == "edited"
        assert (repo / "sub" / "new.txt").read_text() == "new"
    owners = {str(p): (p.lstat().st_uid, p.lstat().st_gid) for p in [repo, *repo.rglob("*")]}
    assert set(owners.values()) == {owner}, {p: o for p, o in owners.items() if o != owner}
    status = _as_owner("git", "-C", str(repo), "status", "--porcelain", home=home, owner=owner)
    assert status.returncode == 0, status.stderr
    if backend != "docker":
        assert "a.txt" in status.stdout
        assert "sub/" in status.stdout


PEEK = ("import sys\ntry:\n    print(open(sys.argv[1]).read())\nexcept OSError as exc:\n"
        "    print('REFUSED', type(exc).__name__)\n")


@pytest.mark.parametrize("backend", ["proc-bwrap", "proc-landlock", "proc-unshare", "local"])
def test_running_as_the_owner_does_not_open_the_owners_other_files(
        tmp_path: Path, place: Path, backend: str) -> None:
    """The owner's identity reaches what the profile grants, not the rest of that user's
    files: a 0700 directory of the owner's beside the repository stays out of reach (bind view,
    Landlock rules, and the local runner's carve-out of the uid's other directories)."""
    repo = _repo(place)
    other = place / "private"
    other.mkdir(mode=0o700)
    (other / "secret.txt").write_text("OWNER-SECRET")
    for path in (other, other / "secret.txt"):
        os.lchown(path, *OWNER)
    args = _args(tmp_path, repo, backend)
    req = json.loads((tmp_path / "req.json").read_text())
    req["op"]["args"] = ["-c", PEEK, str(other / "secret.txt")]
    (tmp_path / "req.json").write_text(json.dumps(req))
    out = json.loads(_cli("run", *args, "--format", "json").stdout)
    assert out["result"]["ok"] is True, out["result"]
    assert "OWNER-SECRET" not in out["result"]["out"]["stdout"]
    assert out["result"]["out"]["stdout"].startswith("REFUSED"), out["result"]["out"]


