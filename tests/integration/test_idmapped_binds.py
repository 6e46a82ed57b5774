"""A root-owned writable tree is written through an id-mapped bind (issue 26 item 5), attacked:
a hard link in it to a host file stays root's and unwritable, new links cannot leave the mount,
no set-id file appears, and without an id-mapped bind nothing changes owner either."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plugins.executor_proc import uid
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from plugins.executor_proc.idmap import IDMAP_DIR
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from tests.integration.test_backend_refusal_decision import (
    _cli,
    assert_run_denies_as_explain_said,
)
from tests.integration.test_proc_sandbox import make_profile
from tests.integration.test_write_identity import _args, _repo, place  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

PROC = ["proc-bwrap", "proc-landlock", "proc-unshare", "local"]

LINKS = """
import errno, json, os, sys
repo, r = sys.argv[1], {}
def attempt(key, fn):
    try:
        fn()
        r[key] = "ok"
    except OSError as e:
        r[key] = errno.errorcode.get(e.errno, str(e.errno))
def append(p):
    with open(p, "a") as fh:
        fh.write("PWNED")
attempt("write-hard", lambda: append(f"{repo}/hard"))
attempt("chmod-hard", lambda: os.chmod(f"{repo}/hard", 0o666))
attempt("truncate-hard", lambda: os.truncate(f"{repo}/hard", 0))
attempt("relink-hard", lambda: os.link(f"{repo}/hard", f"{repo}/sub/hard2"))
attempt("write-relinked", lambda: append(f"{repo}/sub/hard2"))
attempt("rename-hard", lambda: os.rename(f"{repo}/hard", f"{repo}/sub/moved"))
attempt("link-system", lambda: os.link(os.path.realpath(sys.executable), f"{repo}/py"))
attempt("link-inside", lambda: os.link(f"{repo}/a.txt", f"{repo}/sub/a2"))
attempt("write-a", lambda: append(f"{repo}/a.txt"))
print(json.dumps(r))
"""


def _run_cli(tmp_path: Path, repo: Path, backend: str, code: str) -> dict[str, object]:
    args = _args(tmp_path, repo, backend)
    req = json.loads((tmp_path / "req.json").read_text())
    req["op"]["args"] = ["-c", code, str(repo)]
    (tmp_path / "req.json").write_text(json.dumps(req))
    out = json.loads(_cli("run", *args, "--format", "json").stdout)
    assert out["result"]["ok"] is True, out["result"]
    result: dict[str, object] = out["result"]["out"]
    return result


@pytest.mark.parametrize("backend", PROC)
def test_a_hard_link_to_a_host_file_stays_root_s_and_unwritable(
        tmp_path: Path, place: Path, backend: str) -> None:  # noqa: F811
    """The id-mapped bind shows every root inode of the tree as the sandbox's own; a name in
    the workspace for a host file (outside every bind) must not become writable, nor its mode
    changeable. Links the sandbox makes stay inside its mount (EXDEV from anywhere else)."""
    repo = _repo(place, (0, 0))
    host = place / "host-file.txt"  # outside the writable tree, same file system
    host.write_text("host")
    host.chmod(0o644)
    os.link(host, repo / "hard")
    out = _run_cli(tmp_path, repo, backend, LINKS)
    seen = json.loads(str(out["stdout"]))
    for key in ("write-hard", "chmod-hard", "truncate-hard"):
        assert seen[key] != "ok", seen
    assert seen["relink-hard"] != "ok" or seen["write-relinked"] != "ok", seen
    assert seen["rename-hard"] != "ok", seen  # a mount point (bwrap) or a carved name
    assert seen["link-system"] == "EXDEV", seen  # linkat across mounts
    assert seen["link-inside"] == "ok", seen  # the tree's own files link as before
    assert seen["write-a"] == "ok", seen
    st = host.lstat()
    assert (host.read_text(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (
        "host", 0, 0, 0o644)
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [repo, *repo.rglob("*")]}
    assert owners == {(0, 0)}, owners
    assert (repo / "sub" / "a2").read_text() == "aPWNED"  # one inode, written through a.txt


SETUID = ("import os, sys, shutil\np = os.path.join(sys.argv[1], 'sh')\n"
          "shutil.copy('/bin/sh', p)\ntry:\n    os.chmod(p, 0o4755)\n    print('SETUID-SET')\n"
          "except OSError as exc:\n    print('REFUSED', exc.errno)\n"
          "try:\n    fd = os.open(p + '2', os.O_CREAT | os.O_WRONLY, 0o6755)\n"
          "    os.close(fd)\n    print('CREATED')\n"
          "except OSError as exc:\n    print('REFUSED', exc.errno)\n")


@pytest.mark.parametrize("backend", PROC)
def test_no_set_uid_root_file_through_the_id_mapped_bind(
        tmp_path: Path, place: Path, backend: str) -> None:  # noqa: F811
    """What the sandbox writes in a root-owned tree is root's on disk: a set-uid copy of a
    shell there would be a host root shell. The seccomp filter refuses the modes; the copy
    exists, owned by root, without the bit."""
    repo = _repo(place, (0, 0))
    out = _run_cli(tmp_path, repo, backend, SETUID)
    lines = str(out["stdout"]).split("\n")
    assert lines[0].startswith("REFUSED"), out
    assert lines[1].startswith("REFUSED"), out
    st = (repo / "sh").lstat()
    assert (st.st_uid, st.st_mode & 0o6000) == (0, 0)
    assert not (repo / "sh2").exists() or (repo / "sh2").lstat().st_mode & 0o6000 == 0


def _tree(where: Path) -> Path:
    """make_profile's layout: ``root/**`` readable, ``root/out/**`` writable, root's."""
    (where / "out").mkdir(mode=0o755)
    (where / "out" / "a.txt").write_text("a")
    return where


def _execute(ex: ProcExecutor, root: Path, code: str) -> dict[str, object]:
    ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
    out = ex.execute(ctx, ProcExecOp(tool="/usr/bin/python3", args=("-c", code,
                                                                  str(root / "out")))).out
    assert isinstance(out, dict)
    return out


WRITE = ("import sys\ntry:\n    open(sys.argv[1] + '/a.txt', 'a').write('x'); print('WROTE')\n"
         "except OSError as exc:\n    print('REFUSED', exc.errno)\n")


def test_without_an_id_mapped_bind_strict_refuses_and_compat_changes_no_owner(
        place: Path) -> None:  # noqa: F811
    """bwrap without layer 2 has no seccomp filter for set-id modes, so no id-mapped bind:
    strict refuses with a code that says why, compat runs with root's entries unwritable and
    says so; neither changes an owner (the hand-over by chown is gone)."""
    root = _tree(place)
    strict = ProcExecutor("bwrap", ProcOptions(layer2=False))
    compat = ProcExecutor("bwrap", ProcOptions(layer2=False), mode="compat")
    try:
        with pytest.raises(PolicyEngineError) as refused:
            _execute(strict, root, WRITE)
        assert refused.value.code is ErrorCode.CAPABILITY_BLOCKED
        assert "no id-mapped bind" in str(refused.value)
        assert "compat mode" in str(refused.value)
        out = _execute(compat, root, WRITE)
        assert str(out["stdout"]).startswith("REFUSED"), out
        assert "no id-mapped bind" in str(out.get("degraded")), out
        assert "nothing changed owner" in str(out.get("degraded")), out
    finally:
        strict.close()
        compat.close()
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [root, *root.rglob("*")]}
    assert owners == {(0, 0)}, owners
    assert (root / "out" / "a.txt").read_text() == "a"


def test_past_the_cap_of_linked_root_files_the_call_is_refused(place: Path) -> None:  # noqa: F811
    """Each hard-linked root file is a mount of its own: past ``uid.MAX_LINKED`` the call
    fails closed, in compat mode too, with the code and what to do."""
    root = _tree(place)
    outside = place / "outside"
    outside.mkdir()
    for i in range(uid.MAX_LINKED + 1):
        (outside / f"f{i}").write_text("x")
        os.link(outside / f"f{i}", root / "out" / f"f{i}")
    ex = ProcExecutor("bwrap", mode="compat")
    try:
        with pytest.raises(PolicyEngineError) as refused:
            _execute(ex, root, WRITE)
    finally:
        ex.close()
    assert refused.value.code is ErrorCode.CAPABILITY_BLOCKED
    assert "find PATH -type f -links +1" in str(refused.value)
    assert not (root / "out" / "a.txt").read_text().endswith("x")


def test_links_kept_inside_the_tree_stay_writable(place: Path) -> None:  # noqa: F811
    """Two names of one root file, both inside the tree (a `cp -al` copy, a pnpm store): no
    host file is reached through them, so they are written like any other."""
    root = _tree(place)
    os.link(root / "out" / "a.txt", root / "out" / "b.txt")
    assert uid.linked_files([str(root / "out")]) == []
    os.link(root / "out" / "a.txt", place / "elsewhere.txt")
    assert uid.linked_files([str(root / "out")]) == sorted(
        [str(root / "out" / "a.txt"), str(root / "out" / "b.txt")])


CHMOD = ("import errno, json, os, sys\nr = {}\nfor p in sys.argv[2:]:\n"
         "    try:\n        os.chmod(p, 0o666); r[p] = 'ok'\n"
         "    except OSError as e:\n        r[p] = errno.errorcode.get(e.errno, str(e.errno))\n"
         "print(json.dumps(r))\n")


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "unshare"])
def test_masked_files_in_a_mapped_tree_keep_their_mode(place: Path, backend: str) -> None:  # noqa: F811
    """Through the id-mapped bind root's files look like the sandbox's own, and Landlock
    governs no ``chmod``: a masked ``.env`` (0600) must not be opened to every host user by a
    mode change; it is bound from the plain tree, root's, like a hard-linked file."""
    root = _tree(place)
    env = root / "out" / ".env"
    env.write_text("SECRET=1")
    env.chmod(0o600)
    ex = ProcExecutor(backend)
    try:
        ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
        out = ex.execute(ctx, ProcExecOp(tool="/usr/bin/python3", args=(
            "-c", CHMOD, "-", str(env), str(root / "out" / "a.txt")))).out
    finally:
        ex.close()
    assert isinstance(out, dict)
    seen = json.loads(str(out["stdout"]))
    assert seen[str(env)] != "ok", seen
    assert seen[str(root / "out" / "a.txt")] == "ok", seen  # the tree's own files: as before
    assert (stat.S_IMODE(env.lstat().st_mode), env.lstat().st_uid) == (0o600, 0)


def test_explain_refuses_what_the_run_refuses_without_an_id_mapped_bind(
        tmp_path: Path, place: Path) -> None:  # noqa: F811
    """Dry run equals run: proc-bwrap without layer 2 in strict mode is refused for a
    root-owned tree by `explain` and by `run` alike, the same code and reason."""
    repo = _repo(place, (0, 0))
    args = _args(tmp_path, repo, "proc-bwrap")
    (tmp_path / "engine.yaml").write_text(
        f"state_dir: {tmp_path / 'state'}\nmode: strict\nbackends: {{proc.exec: proc-bwrap}}\n"
        "options: {proc: {layer2: false}}\n")
    dry = _cli("explain", *args, "--format", "json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    said = json.loads(dry.stdout)
    assert said["decision"] == "deny", said
    assert said["code"] == "SANDBOX.CAPABILITY_BLOCKED", said
    assert "no id-mapped bind" in said["reason"], said
    assert_run_denies_as_explain_said(_cli("run", *args, "--format", "json"), said)
    assert (repo / "a.txt").read_text() == "a"
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [repo, *repo.rglob("*")]}
    assert owners == {(0, 0)}, owners


_START_ANOTHER_ENGINE = """
from plugins.executor_proc import idmap
idmap._private_dir()
"""


def test_another_engine_starting_hides_no_mapping(tmp_path: Path) -> None:
    """Each engine process made ``IDMAP_DIR`` a mount of its own (a bind onto itself:
    ``os.path.ismount`` is false for a bind within one file system, so every start bound it
    again; this host had 661 of them stacked). The new bind, not recursive, covered the
    mappings other processes had made under it: a docker container then got the empty 0700
    directory beneath, and its first command failed "Permission denied" (one in five runs of
    test_docker_sessions.py beside other tests). Another engine starting leaves a live mapping
    visible, and adds no mount."""
    from plugins.executor_proc import idmap

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "kept.txt").write_text("kept")
    mapped = idmap.IdMapped([str(tree)], 65533, 65533)
    try:
        target = mapped.mounts[str(tree)]
        assert os.listdir(target) == ["kept.txt"]

        def stacked() -> int:
            with open("/proc/self/mountinfo") as fh:
                return sum(line.split()[4] == idmap.IDMAP_DIR for line in fh)

        before = stacked()
        for _ in range(3):
            done = subprocess.run([sys.executable, "-c", _START_ANOTHER_ENGINE],
                                  cwd=Path(__file__).resolve().parents[2], capture_output=True,
                                  text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
        assert os.listdir(target) == ["kept.txt"]  # still the tree, not the empty mount point
        assert os.stat(target).st_uid == 65533  # and still mapped
        assert stacked() == before
    finally:
        mapped.close()


_HOLD_A_MAPPING = """
import os, sys, time
from plugins.executor_proc import idmap
mapped = idmap.IdMapped([sys.argv[1]], 65533, 65533)
print(mapped.mounts[sys.argv[1]], flush=True)
time.sleep(600)
"""


def _mounted_at(path: str) -> bool:
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == path for line in fh)


def _holder(tree: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_A_MAPPING, str(tree)],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    target = proc.stdout.readline().strip()
    assert target.startswith(f"{IDMAP_DIR}/"), target
    assert _mounted_at(target)
    return proc, target


def test_a_killed_engines_mappings_are_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    """An engine killed while it held an id-mapped mount (SIGKILL, OOM, a crashed server with
    a live docker session) left the mapping in the host's mount table for good: this host had
    87 of them, each keeping a deleted test tree busy (`rm -rf` of the workspace failed "Device
    or resource busy"). The next engine to start detaches the mappings whose owner is gone,
    keeps a live engine's, and never deletes a file of the mapped tree."""
    dead_tree, live_tree = tmp_path / "dead", tmp_path / "live"
    for tree in (dead_tree, live_tree):
        tree.mkdir()
        (tree / "kept.txt").write_text("kept")
    dead, dead_target = _holder(dead_tree)
    live, live_target = _holder(live_tree)
    try:
        dead.kill()
        dead.wait()
        assert _mounted_at(dead_target)  # nobody detached it
        started = subprocess.run([sys.executable, "-c", _START_ANOTHER_ENGINE],
                                 cwd=Path(__file__).resolve().parents[2], capture_output=True,
                                 text=True, timeout=60, check=False)
        assert started.returncode == 0, started.stderr
        assert not _mounted_at(dead_target)
        assert not os.path.exists(os.path.dirname(dead_target))
        assert _mounted_at(live_target)
        assert os.listdir(live_target) == ["kept.txt"]
        assert (dead_tree / "kept.txt").read_text() == "kept"  # detached, never emptied
        assert (live_tree / "kept.txt").read_text() == "kept"
    finally:
        live.kill()
        live.wait()
        dead.kill()
        dead.wait()
        subprocess.run([sys.executable, "-c", _START_ANOTHER_ENGINE],
                       cwd=Path(__file__).resolve().parents[2], check=False, timeout=60)
