"""Docker bound calls never change the ownership of the user's files (issue 26 item 5).

A bound call (cwd outside the container's ``/workspace``) binds the user's tree at its own path.
Before, a root engine handed every root-owned entry of it to the container's uid 1000 first (a
``chown``: root's git then called the repository "dubious ownership"), and a tree owned by
another user was written as 1000. Now the tree's one non-root owner runs the container, and a
root-owned tree is bound from an id-mapped mount showing root as 1000: run for real through the
CLI on run-once and warm containers, every owner stays, new files are the owner's, the owner's
``git status`` works, a hard link to a host file stays unwritable, and bubblewrap and Docker
write each other's files. Strict mode without an id-mapped bind refuses (explain = run).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.identity import plan
from plugins.executor_proc.idmap import IDMAP_DIR
from policy_engine import ErrorCode, PolicyEngineError
from tests.integration.test_backend_refusal_decision import (
    _cli,
    assert_run_denies_as_explain_said,
)
from tests.integration.test_idmapped_binds import LINKS, SETUID
from tests.integration.test_write_identity import (  # noqa: F401 (fixture)
    EDIT,
    OWNER,
    _args,
    _as_owner,
    _repo,
    place,
)

pytestmark = pytest.mark.integration

MODES = ["run-once", "pool"]


def _bound(tmp_path: Path, repo: Path, mode: str, code: str = EDIT,
           backend: str = "docker", security: str = "strict",
           base_url: str | None = None, runtime: str | None = None) -> list[str]:
    """CLI arguments of one call with ``cwd`` = the repository: a docker bound call."""
    args = _args(tmp_path, repo, "proc-bwrap")  # the host paths, as bubblewrap sees them
    req = json.loads((tmp_path / "req.json").read_text())
    req["op"]["args"] = ["-c", code, str(repo)]
    req["op"]["cwd"] = str(repo)
    (tmp_path / "req.json").write_text(json.dumps(req))
    docker = {"mode": mode, "pool_size": 1, **({"base_url": base_url} if base_url else {}),
              **({"runtime": runtime} if runtime else {})}
    (tmp_path / "engine.yaml").write_text(json.dumps({
        "state_dir": str(tmp_path / "state"), "mode": security,
        "backends": {"proc.exec": backend}, "options": {"docker": docker}}))
    return args


def _run(args: list[str]) -> dict[str, object]:
    ran = _cli("run", *args, "--format", "json")
    out = json.loads(ran.stdout)
    assert out["result"]["ok"] is True, out["result"]
    result: dict[str, object] = out["result"]["out"]
    return result


def _owners(repo: Path) -> set[tuple[int, int]]:
    return {(p.lstat().st_uid, p.lstat().st_gid) for p in [repo, *repo.rglob("*")]}


@pytest.mark.parametrize("owner", [OWNER, (0, 0), (1234, 1234)],
                         ids=["uid-1000", "root-owned", "uid-1234"])
@pytest.mark.parametrize("mode", MODES)
def test_a_docker_bound_write_keeps_every_owner(
        tmp_path: Path, place: Path, mode: str,  # noqa: F811
        owner: tuple[int, int]) -> None:
    """The tool edits a file and creates one in a subdirectory of the user's tree: written,
    every owner unchanged (root's through the id-mapped bind), the new file the owner's, the
    owner's git reads the repository (root's with no `safe.directory`)."""
    assert os.geteuid() == 0, "the engine must be root: that is when ownership was changed"
    repo = _repo(place, owner)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, *owner)
    out = _run(_bound(tmp_path, repo, mode))
    assert str(out["stdout"]).strip() == "WROTE", (out["stdout"], out["stderr"],
                                                   out["exit_code"])
    assert "degraded" not in out, out
    assert (repo / "a.txt").read_text() == "edited"
    assert (repo / "sub" / "new.txt").read_text() == "new"
    assert _owners(repo) == {owner}
    status = _as_owner("git", "-C", str(repo), "status", "--porcelain", home=home, owner=owner)
    assert status.returncode == 0, status.stderr
    assert "a.txt" in status.stdout, status.stdout
    assert "sub/" in status.stdout, status.stdout
    meta = json.loads(next((tmp_path / "state").rglob("meta.json")).read_text())
    user = "1000:1000" if owner == (0, 0) else f"{owner[0]}:{owner[1]}"
    assert meta["policy_snapshot"]["container"]["user"] == user, meta
    mapped = [m["source"] for m in meta["mounts"] if m.get("target") == str(repo)]
    if owner == (0, 0) and mode == "run-once":  # bound from the mapping, detached after
        assert mapped[0].startswith(f"{IDMAP_DIR}/"), meta["mounts"]
        _detached(mapped[0])
    elif mode == "run-once":  # its owner writes it: the plain tree
        assert mapped == [str(repo)], meta["mounts"]


def mount_points() -> set[str]:
    """The mount points of the engine's mount namespace (``os.path.ismount`` cannot tell a
    bind of a directory of the same file system)."""
    with open("/proc/self/mountinfo") as fh:
        return {line.split()[4] for line in fh}


def _detached(mapped: str) -> None:
    deadline = time.monotonic() + 10  # detached in the background after the result
    while mapped in mount_points() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mapped not in mount_points()


@pytest.mark.parametrize("mode", MODES)
def test_a_hard_link_in_a_root_tree_stays_unwritable_from_the_container(
        tmp_path: Path, place: Path, mode: str) -> None:  # noqa: F811
    """The id-mapped bind shows root's inodes as uid 1000's; a name in the tree for a host
    file outside it is bound read-only from the plain tree inside the mapped mount, and Docker's
    recursive bind carries that bind into the container: unwritable, its mode unchangeable."""
    repo = _repo(place, (0, 0))
    host = place / "host-file.txt"  # outside the writable tree, same file system
    host.write_text("host")
    host.chmod(0o644)
    os.link(host, repo / "hard")
    seen = json.loads(str(_run(_bound(tmp_path, repo, mode, LINKS))["stdout"]))
    for key in ("write-hard", "chmod-hard", "truncate-hard", "rename-hard"):
        assert seen[key] != "ok", seen
    assert seen["relink-hard"] != "ok" or seen["write-relinked"] != "ok", seen
    assert seen["link-system"] == "EXDEV", seen
    assert seen["link-inside"] == "ok", seen
    assert seen["write-a"] == "ok", seen
    st = host.lstat()
    assert (host.read_text(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (
        "host", 0, 0, 0o644)
    assert _owners(repo) == {(0, 0)}


def test_no_set_uid_root_file_through_the_docker_id_mapped_bind(
        tmp_path: Path, place: Path) -> None:  # noqa: F811
    """What the container writes in a root-owned tree is root's on disk: the set-id modes
    are refused (the container's seccomp profile) and nothing set-id is left behind."""
    repo = _repo(place, (0, 0))
    lines = str(_run(_bound(tmp_path, repo, "run-once", SETUID))["stdout"]).split("\n")
    assert lines[0].startswith("REFUSED"), lines
    assert lines[1].startswith("REFUSED"), lines
    st = (repo / "sh").lstat()
    assert (st.st_uid, st.st_mode & 0o6000) == (0, 0)
    assert not (repo / "sh2").exists() or (repo / "sh2").lstat().st_mode & 0o6000 == 0


APPEND = ("import sys, pathlib\nr = pathlib.Path(sys.argv[1])\n"
          "with open(r / sys.argv[2], 'a') as fh:\n    fh.write(sys.argv[3])\n"
          "(r / sys.argv[4]).write_text(sys.argv[3])\nprint('OK')")


@pytest.mark.parametrize("mode", MODES)
def test_bubblewrap_and_docker_write_each_others_files(
        tmp_path: Path, place: Path, mode: str) -> None:  # noqa: F811
    """One root-owned tree, calls alternating between bubblewrap (root seen as 65533) and
    Docker (root seen as 1000): each appends to the file the other created, all stays root's."""
    repo = _repo(place, (0, 0))
    (repo / "f0").write_text("")
    for i, backend in enumerate(["proc-bwrap", "docker", "proc-bwrap", "docker"]):
        args = _bound(tmp_path, repo, mode, APPEND, backend=backend)
        req = json.loads((tmp_path / "req.json").read_text())
        req["op"]["args"] = ["-c", APPEND, str(repo), f"f{i}", backend, f"f{i + 1}"]
        (tmp_path / "req.json").write_text(json.dumps(req))
        assert str(_run(args)["stdout"]).strip() == "OK"
    assert (repo / "f1").read_text() == "proc-bwrapdocker"
    assert (repo / "f3").read_text() == "proc-bwrapdocker"
    assert _owners(repo) == {(0, 0)}
    git = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                         text=True, check=False)
    assert git.returncode == 0, git.stderr


def test_strict_refuses_without_an_id_mapped_bind_as_explain_said(
        tmp_path: Path, place: Path) -> None:  # noqa: F811
    """A docker engine not on this host cannot bind the engine's id-mapped mount: strict mode
    refuses the bound call on a root-owned tree, explain first and run alike, never a chown."""
    repo = _repo(place, (0, 0))
    args = _bound(tmp_path, repo, "run-once", base_url="tcp://127.0.0.1:9")
    dry = _cli("explain", *args, "--format", "json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    said = json.loads(dry.stdout)
    assert said["decision"] == "deny", said
    assert said["code"] == "SANDBOX.CAPABILITY_BLOCKED", said
    assert "no id-mapped bind" in said["reason"], said
    assert_run_denies_as_explain_said(_cli("run", *args, "--format", "json"), said)
    assert (repo / "a.txt").read_text() == "a"
    assert _owners(repo) == {(0, 0)}


def test_compat_binds_root_s_tree_unwritable_and_says_so(place: Path) -> None:  # noqa: F811
    """Without an id-mapped bind compat mode plans the tree bound as it is (uid 1000 cannot
    write root's entries) with the reason recorded; strict raises; a tree owned by one user
    needs no mapping at all (its owner runs the container)."""
    repo = _repo(place, (0, 0))
    remote = DockerOptions(base_url="tcp://127.0.0.1:9")
    ident = plan(((str(repo), False),), [], remote, "compat")
    assert (ident.roots, ident.user) == ((), "1000:1000")
    assert "nothing changed owner" in str(ident.degraded)
    with pytest.raises(PolicyEngineError) as refused:
        plan(((str(repo), False),), [], remote, "strict")
    assert refused.value.code is ErrorCode.CAPABILITY_BLOCKED
    mine = _repo(place / "u", (1234, 1234))
    assert plan(((str(mine), False),), [], remote, "strict").user == "1234:1234"
    assert _owners(repo) == {(0, 0)}


WRITE_A = ("import sys, pathlib\ntry:\n    (pathlib.Path(sys.argv[1]) / 'a.txt').write_text('x')\n"
           "    print('WROTE')\nexcept OSError as exc:\n    print('REFUSED', exc.errno)")


def test_gvisor_cannot_carry_the_mapping_strict_refuses_compat_degrades(
        tmp_path: Path, place: Path) -> None:  # noqa: F811
    """gVisor's file proxy cannot use an id-mapped mount (EOVERFLOW): on runsc, strict mode
    refuses the bound call on a root-owned tree (explain = run); compat runs it with the tree
    unwritable to uid 1000 and says so in `degraded`. Nothing changes owner either way."""
    repo = _repo(place, (0, 0))
    args = _bound(tmp_path, repo, "run-once", WRITE_A, runtime="runsc")
    dry = _cli("explain", *args, "--format", "json")
    said = json.loads(dry.stdout)
    assert said["decision"] == "deny", said
    assert "gVisor" in said["reason"], said
    assert_run_denies_as_explain_said(_cli("run", *args, "--format", "json"), said)
    args = _bound(tmp_path, repo, "run-once", WRITE_A, runtime="runsc", security="compat")
    out = _run(args)
    assert str(out["stdout"]).startswith("REFUSED"), out
    assert "nothing changed owner" in json.dumps(out["degraded"]), out
    assert (repo / "a.txt").read_text() == "a"
    assert _owners(repo) == {(0, 0)}
