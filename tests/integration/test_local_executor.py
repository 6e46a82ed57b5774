"""The `local` executor (issue 17 item 4, seed 004 S2 LocalSandboxRunner), run for real: argv on
the host, always degraded, refused in strict mode, and still holding the mandatory denies (the
house rule: they never degrade). Each attack names the layer that stops it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from plugins.executor_local import plugin as local_plugin
from plugins.executor_local.executor import NOT_ISOLATED, LocalExecutor
from plugins.executor_proc import landlock
from plugins.executor_proc.executor import ProcOptions
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.config import EngineConfig
from policy_engine.conformance.suite import run_suite
from policy_engine.executor import ExecContext
from policy_engine.model import OpKind, ProcExecOp, Profile
from policy_engine.orchestration import select
from tests.integration.planted import planted_world
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"
"""The lead's editable install may predate the entry point (pyproject.toml); then the tests
register the same plugin module themselves, as a third party's entry point would."""


@pytest.fixture(scope="module")
def local_ex() -> Iterator[LocalExecutor]:
    ex = LocalExecutor()
    assert ex.available() is True, ex.unavailable_reason  # Landlock works here
    yield ex
    ex.close()


@pytest.fixture
def world() -> Iterator[Path]:
    """A workspace the sandbox uid can traverse, with a HOME holding planted secrets."""
    with planted_world("local-ws-") as r:
        yield r


@pytest.fixture
def elsewhere() -> Iterator[Path]:
    """A project outside every path the profile names, holding its own secret (not in /tmp:
    the runner's host view leaves the shared /tmp out)."""
    r = Path(tempfile.mkdtemp(prefix="local-other-", dir="/var/tmp"))  # /tmp is hidden
    r.chmod(0o755)
    (r / "app").mkdir(mode=0o755)
    (r / "app" / ".env").write_text("OTHER=elsewhere-secret-marker")
    (r / "app" / ".env").chmod(0o644)
    (r / "app" / "README").write_text("public")
    (r / "app" / "README").chmod(0o644)
    yield r
    shutil.rmtree(r, ignore_errors=True)


def _run(ex: LocalExecutor, profile: Profile, code: str, *args: str, timeout: float = 60,
         env: dict[str, str] | None = None) -> dict[str, object]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + timeout)
    return ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", code, *args),
                                      env=env or {})).out


ATTEMPTS = textwrap.dedent("""
    import json, os, socket, sys
    R = {}
    def attempt(name, fn):
        try:
            R[name] = fn()
        except OSError as e:
            R[name] = "refused: " + (os.strerror(e.errno) if e.errno else type(e).__name__)
    def read(p):
        return open(p).read()
    def ls(p):
        return len(os.listdir(p))
    def write(p):
        open(p, "w").write("x"); return "written"
    def unix(p):
        s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(p); return "connected"
    for key, path in json.loads(sys.argv[1]).items():
        kind = key.partition(":")[0]
        attempt(key, lambda: {"read": read, "list": ls, "write": write, "unix": unix}[kind](path))
    print(json.dumps(R))
""")


def _attempt(ex: LocalExecutor, profile: Profile, targets: dict[str, str]) -> dict[str, str]:
    out = _run(ex, profile, ATTEMPTS, json.dumps(targets))
    assert out["exit_code"] == 0, out
    seen = json.loads(str(out["stdout"]))
    assert isinstance(seen, dict)
    return seen


def test_the_whole_host_is_there_but_no_secret_on_it(local_ex: LocalExecutor, world: Path,
                                                     elsewhere: Path) -> None:
    """Layer: Landlock carving over a whole-host mask plan. The runner reads a project the
    profile never named (it isolates nothing else), but neither that project's .env nor the
    sandbox HOME's ~/.ssh key nor /etc/shadow; the shared /tmp and /proc (every process's
    argv) are outside its view."""
    seen = _attempt(local_ex, make_profile(world), {
        "read:public": str(elsewhere / "app" / "README"),
        "read:other-env": str(elsewhere / "app" / ".env"),
        "read:ssh": str(world / "home" / ".ssh" / "id_ed25519"),
        "read:env": str(world / ".env"), "read:shadow": "/etc/shadow",
        "read:proc": "/proc/1/cmdline", "list:tmp": "/tmp"})
    assert seen["read:public"] == "public", seen
    secrets = {k: v for k, v in seen.items() if k != "read:public"}
    assert all(str(v).startswith("refused") for v in secrets.values()), seen
    assert "marker" not in json.dumps(seen)


def test_another_workspace_of_the_sandbox_uid_stays_unwritten(local_ex: LocalExecutor,
                                                              world: Path,
                                                              elsewhere: Path) -> None:
    """Layer: Landlock grants writes on the profile's writable paths only. Every proc sandbox
    runs as the one `run_as` uid and the workspaces it wrote are handed to it: a runner writing
    wherever that uid may would tamper with all of them."""
    other = elsewhere / "app"
    os.chown(other, 65533, 65533)
    os.chown(other / "README", 65533, 65533)
    seen = _attempt(local_ex, make_profile(world), {
        "write:other-file": str(other / "README"), "write:other-new": str(other / "planted"),
        "write:own": str(world / "out" / "fine")})
    assert seen["write:own"] == "written", seen
    assert seen["write:other-file"].startswith("refused"), seen
    assert seen["write:other-new"].startswith("refused"), seen
    assert (other / "README").read_text() == "public"
    assert not (other / "planted").exists()


def _hand_over(*paths: Path) -> None:
    """What the proc backends do to a workspace a call wrote: owned by the sandbox uid,
    closed to everyone else."""
    for p in paths:
        os.chown(p, 65533, 65533)
        p.chmod(0o700 if p.is_dir() else 0o600)


def test_another_workspace_of_the_sandbox_uid_stays_unread(local_ex: LocalExecutor,
                                                           world: Path, elsewhere: Path) -> None:
    """Attack round 4, F01. Layer: the mask plan carves every directory the sandbox uid owns
    outside the profile's paths. All proc sandboxes share `run_as` and every workspace a call
    wrote was handed to it, so the host's permission bits cannot keep one tenant's 0600 files
    from another tenant's local call; before the fix the read returned the marker."""
    other = elsewhere / "tenants" / "acme" / "work"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("TENANT-A-marker")
    for p in (elsewhere / "tenants", elsewhere / "tenants" / "acme"):
        p.chmod(0o755)
    _hand_over(other, other / "secret.txt")
    seen = _attempt(local_ex, make_profile(world), {
        "read:other": str(other / "secret.txt"), "list:other": str(other),
        "read:public": str(elsewhere / "app" / "README")})
    assert seen["read:public"] == "public", seen
    assert str(seen["read:other"]).startswith("refused"), seen
    # hidden (an empty directory in its place) or refused: no file name either way
    assert seen["list:other"] == 0 or str(seen["list:other"]).startswith("refused"), seen
    assert "marker" not in json.dumps(seen)


def test_a_sibling_workspace_under_a_handed_over_parent_stays_unread(
        local_ex: LocalExecutor, elsewhere: Path) -> None:
    """The call's own workspace is handed over as well, and so may its parent be (a project
    written whole by an earlier call): the call still reads and writes its own, never the
    sibling's, and a workspace handed over after the first (cached) walk is caught too."""
    projects = elsewhere / "projects"
    mine, sibling, later = projects / "p1", projects / "p2", projects / "p3"
    for d in (mine / "out", mine / "home", sibling):
        d.mkdir(parents=True)
    (mine / "own.txt").write_text("mine")
    (sibling / "data.csv").write_text("name,card-marker")
    _hand_over(projects, mine, mine / "out", mine / "home", mine / "own.txt",
               sibling, sibling / "data.csv")
    profile = make_profile(mine)
    seen = _attempt(local_ex, profile, {
        "read:own": str(mine / "own.txt"), "write:own": str(mine / "out" / "new"),
        "read:sibling": str(sibling / "data.csv"), "list:sibling": str(sibling)})
    assert seen["read:own"] == "mine", seen
    assert seen["write:own"] == "written", seen
    assert str(seen["read:sibling"]).startswith("refused"), seen
    assert seen["list:sibling"] == 0 or str(seen["list:sibling"]).startswith("refused"), seen
    # created by the engine (root, world-readable), walked, then handed over: the hand-over
    # changes only the owner, which the directory cache must notice
    later.mkdir(mode=0o755)
    (later / "late.txt").write_text("late-marker")
    (later / "late.txt").chmod(0o644)
    first = _attempt(local_ex, profile, {"read:later": str(later / "late.txt")})
    assert first["read:later"] == "late-marker", first  # root's: any host user may read it
    os.chown(later, 65533, 65533)
    os.chown(later / "late.txt", 65533, 65533)
    seen = _attempt(local_ex, profile, {"read:later": str(later / "late.txt")})
    assert str(seen["read:later"]).startswith("refused"), seen


def _deep(base: Path, levels: int, name: str) -> Path:
    """``levels`` nested directories named ``name`` below ``base`` (built with relative
    ``mkdir``/``chdir``: the full path may exceed PATH_MAX); returns the deepest (by fd path)."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, 0o755, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.mkdir("T", 0o700, dir_fd=fd)
        os.chown("T", 65533, 65533, dir_fd=fd)
        t = os.open("T", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        secret = os.open("s.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=t)
        os.write(secret, b"DEEP-marker")
        os.fchown(secret, 65533, 65533)
        os.close(secret)
        os.close(t)
    finally:
        os.close(fd)
    return base


READ_DEEP = textwrap.dedent("""
    import os, sys
    try:
        os.chdir(sys.argv[1])
        for _ in range(int(sys.argv[2])):
            os.chdir(sys.argv[3])
        print("READ", open("T/s.txt").read())
    except OSError as e:
        print("refused", e.errno)
""")


@pytest.mark.parametrize(("levels", "name"), [(20, "d" * 250), (1100, "d")],
                         ids=["longer-than-PATH_MAX", "1100-deep"])
def test_a_workspace_beyond_what_a_path_can_name_stays_unread(
        local_ex: LocalExecutor, world: Path, elsewhere: Path, levels: int, name: str) -> None:
    """Outsider round 5, F02/F03: a handed-over workspace below PATH_MAX (reached by relative
    chdir) was not hidden and its secret was read; one 1,100 levels deep made every local call
    fail with an internal error (recursion). Such a tree is masked whole where the walk stops."""
    (elsewhere / "deep").mkdir()
    try:
        base = _deep(elsewhere / "deep", levels, name)
        out = _run(local_ex, make_profile(world), READ_DEEP, str(base), str(levels), name)
    finally:  # shutil.rmtree recurses once per level
        subprocess.run(["rm", "-rf", str(elsewhere / "deep")], check=True)
    assert out["exit_code"] == 0, out
    assert str(out["stdout"]).startswith("refused"), out
    assert "marker" not in json.dumps(out)


def test_an_undecodable_workspace_name_neither_breaks_nor_leaks(local_ex: LocalExecutor,
                                                                world: Path,
                                                                elsewhere: Path) -> None:
    """Outsider round 5, F03: one sandbox-owned directory named with a non-UTF-8 byte and a
    newline anywhere on the host made every local call fail (the launcher's command could
    not be encoded)."""
    odd = os.fsencode(elsewhere) + b"/w\xff\nx"
    os.mkdir(odd, 0o700)
    os.chown(odd, 65533, 65533)
    with open(odd + b"/s.txt", "wb") as fh:
        fh.write(b"ODD-marker")
    os.chown(odd + b"/s.txt", 65533, 65533)
    code = "import sys; d = bytes.fromhex(sys.argv[1])\n" \
           "try: print(open(d + b'/s.txt').read())\nexcept OSError as e: print('refused', e)"
    out = _run(local_ex, make_profile(world), code, odd.hex())
    assert out["exit_code"] == 0, out
    assert str(out["stdout"]).startswith("refused"), out


def test_many_handed_over_execs_cost_one_cover_and_no_names(local_ex: LocalExecutor,
                                                            world: Path,
                                                            elsewhere: Path) -> None:
    """Outsider round 5, F04: a service's `artifacts/` holds one handed-over directory per
    exec; past 512 of them every local call on the host was refused. A directory whose every
    entry is hidden is hidden whole; the call's result counts other workspaces, never names
    them (their paths name tenants, projects and execs)."""
    arts = elsewhere / "tenants" / "acme" / "projects" / "p1" / "artifacts"
    arts.mkdir(parents=True)
    for i in range(600):
        d = arts / f"exec{i:04d}"
        d.mkdir(mode=0o700)
        (d / "stdout.txt").write_text(f"exec-{i}-marker")
        _hand_over(d / "stdout.txt", d)
    out = _run(local_ex, make_profile(world), ATTEMPTS, json.dumps({
        "read:exec": str(arts / "exec0599" / "stdout.txt"),
        "read:public": str(elsewhere / "app" / "README")}))
    assert out["exit_code"] == 0, out
    seen = json.loads(str(out["stdout"]))
    assert seen["read:public"] == "public", seen
    assert str(seen["read:exec"]).startswith("refused"), seen
    assert int(str(out["hidden_workspaces"])) >= 1
    assert "acme" not in json.dumps(out["masked"])
    assert "marker" not in json.dumps(out)


def test_the_engine_state_directory_is_hidden(elsewhere: Path, world: Path) -> None:
    """The plugin hides `state_dir` (docker workspaces of every tenant, budgets, evidence)."""
    state = elsewhere / "state"
    (state / "docker" / "projects" / "tenant-b").mkdir(parents=True)
    for d in (state, state / "docker", state / "docker" / "projects",
              state / "docker" / "projects" / "tenant-b"):
        d.chmod(0o755)
    (state / "docker" / "projects" / "tenant-b" / "input.txt").write_text("tenant-b-marker")
    (state / "docker" / "projects" / "tenant-b" / "input.txt").chmod(0o644)
    ex = local_plugin.policy_engine_executors(EngineConfig(state_dir=state))[0]
    try:
        seen = _attempt(ex, make_profile(world), {  # type: ignore[arg-type]
            "read:tenant": str(state / "docker" / "projects" / "tenant-b" / "input.txt"),
            "list:state": str(state), "read:public": str(elsewhere / "app" / "README")})
    finally:
        ex.close()
    assert seen["read:public"] == "public", seen
    assert str(seen["read:tenant"]).startswith("refused"), seen
    # covered by an empty tmpfs (nothing to list) or refused: no tenant's name either way
    assert seen["list:state"] == 0 or str(seen["list:state"]).startswith("refused"), seen


def test_host_control_sockets_are_unreachable(local_ex: LocalExecutor, world: Path) -> None:
    """Layer: seccomp refuses AF_UNIX (Landlock does not govern connect()); a listener planted
    in the workspace is world-connectable, the docker daemon's socket is real."""
    path = str(world / "ctl.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(4)
    try:
        seen = _attempt(local_ex, make_profile(world), {
            "unix:planted": path, "unix:docker": "/var/run/docker.sock"})
    finally:
        srv.close()
    assert not any(v == "connected" for v in seen.values()), seen


def test_not_host_root_and_no_setid_plant(local_ex: LocalExecutor, world: Path) -> None:
    """Layers: the drop to `run_as` (65533) and the seccomp set-id refusal. The tree is root's,
    written through an id-mapped bind: what the sandbox leaves there is root's (issue 26), so
    the set-id refusal is what keeps it from being a root shell."""
    code = textwrap.dedent("""
        import os, shutil, sys
        p = sys.argv[1]
        shutil.copyfile("/usr/bin/true", p)
        try:
            os.chmod(p, 0o4755); print("chmod ok")
        except OSError as e:
            print("refused", e.errno)
        print("uid", os.geteuid())
    """)
    out = _run(local_ex, make_profile(world), code, str(world / "out" / "suid"))
    assert "refused" in str(out["stdout"]), out
    assert "uid 65533" in str(out["stdout"]), out
    st = (world / "out" / "suid").stat()
    assert st.st_mode & 0o6000 == 0
    assert (st.st_uid, st.st_gid) == (0, 0)  # the tree owner's, never handed to 65533
    assert (world / "out").stat().st_uid == 0


def test_a_double_forked_child_dies_at_the_timeout(local_ex: LocalExecutor,
                                                   world: Path) -> None:
    """Layer: the per-call cgroup, killed whole (the grandchild left the process group with
    setpgid; setsid is refused by seccomp)."""
    tag = uuid.uuid4().hex
    code = textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            if os.fork() == 0:
                os.setpgid(0, 0)
                os.execv("/usr/bin/python3", ["python3", "-c",
                         "import time; time.sleep(60)  # orphan-{tag}"])
            os._exit(0)
        time.sleep(60)
    """)
    with pytest.raises(PolicyEngineError) as exc:
        _run(local_ex, make_profile(world), code, timeout=2)
    assert exc.value.code == ErrorCode.TIMEOUT
    time.sleep(1.0)
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if f"orphan-{tag}".encode() in fh.read():
                    left.append(int(pid))
        except OSError:
            continue
    for pid in left:
        os.kill(pid, 9)
    assert left == [], "a grandchild outlived the call's timeout"


def test_environment_is_exactly_what_the_guard_decided(world: Path) -> None:
    """Nothing of the engine's environment is inherited; an allow-listed key is passed."""
    os.environ["PE_HOST_ONLY_SECRET"] = "host-env-marker"
    ex = LocalExecutor(ProcOptions(env_allow=("GIT_AUTHOR_NAME",)))
    try:
        out = _run(ex, make_profile(world), "import json, os; print(json.dumps(dict(os.environ)))",
                   env={"GIT_AUTHOR_NAME": "a"})
    finally:
        ex.close()
        del os.environ["PE_HOST_ONLY_SECRET"]
    env = json.loads(str(out["stdout"]))
    assert env["GIT_AUTHOR_NAME"] == "a"
    assert "PE_HOST_ONLY_SECRET" not in env
    assert set(env) == {"GIT_AUTHOR_NAME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM",
                        "GIT_CONFIG_PARAMETERS", "HOME", "LANG", "PATH", "TMPDIR", "TZ",
                        "PE_ARTIFACTS_DIR"}  # the engine's own (docs/sessions.md)


def test_file_size_memory_pids_and_output_limits(world: Path) -> None:
    ex = LocalExecutor(ProcOptions(max_file_bytes=1 << 20))
    try:
        ctx = ExecContext(profile=make_profile(world), deadline=time.monotonic() + 60)
        with pytest.raises(PolicyEngineError) as exc:  # dd dies of SIGXFSZ (Python ignores it)
            ex.execute(ctx, ProcExecOp(tool="/usr/bin/dd", args=(
                "if=/dev/zero", f"of={world / 'out' / 'big'}", "bs=1M", "count=4")))
        assert exc.value.code == ErrorCode.BUDGET_EXCEEDED
        assert (world / "out" / "big").stat().st_size <= 1 << 20
        # the memory cgroup's OOM killer ends it: a limit hit (attack round 4 F04)
        with pytest.raises(PolicyEngineError) as exc:
            _run(ex, make_profile(world, memory_bytes=64 << 20),
                 "b = bytearray(512 << 20); print('allocated')")
        assert exc.value.code == ErrorCode.BUDGET_EXCEEDED
        assert "memory limit exceeded" in exc.value.reason
        forks = ("import os, time\nn = 0\nfor _ in range(40):\n    try:\n"
                 "        if os.fork() == 0:\n            time.sleep(3); os._exit(0)\n"
                 "        n += 1\n    except OSError:\n        break\nprint('forked', n)")
        out = _run(ex, make_profile(world, pids=8), forks)
        assert 0 < int(str(out["stdout"]).split()[-1]) < 8, out  # pids (cgroup or NPROC)
        out = _run(ex, make_profile(world, max_stdout_bytes=1000), "print('y' * 100000)")
        assert out["stdout_truncated"] is True
        assert len(str(out["stdout"])) <= 1100
    finally:
        ex.close()


def test_exit_codes_follow_the_one_rule(local_ex: LocalExecutor, world: Path) -> None:
    """docs/plugins.md, "Exit codes": the status, 128 + N for signal N, 127 when not found."""
    assert _run(local_ex, make_profile(world), "raise SystemExit(3)")["exit_code"] == 3
    killed = _run(local_ex, make_profile(world), "import os; os.kill(os.getpid(), 9)")
    assert killed["exit_code"] == 128 + 9
    ctx = ExecContext(profile=make_profile(world), deadline=time.monotonic() + 30)
    missing = local_ex.execute(ctx, ProcExecOp(tool="/nonexistent/tool")).out
    assert missing["exit_code"] == 127
    assert "cannot execute" in str(missing["stderr"])


def test_every_result_says_what_it_lacks(local_ex: LocalExecutor, world: Path) -> None:
    out = _run(local_ex, make_profile(world), "print('ok')")
    assert out["degraded"] == [NOT_ISOLATED]
    assert out["backend"] == "local"
    assert out["network"] == "on"
    assert out["network_requested"] == "off"
    caps = local_ex.capabilities
    assert local_ex.local is True
    assert caps.mandatory_denies is True
    assert not caps.bind_mounts
    assert caps.readonly_rootfs  # writes stay the profile's (the shared sandbox uid)
    assert {m.value for m in caps.network_modes} == {"on"}


def test_without_landlock_it_declares_no_mandatory_denies_and_refuses(
        monkeypatch: pytest.MonkeyPatch, world: Path) -> None:
    """A kernel without Landlock cannot be had here: the probe's answer is replaced (the one
    stand-in of this file); everything after it is the real executor."""
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    ex = LocalExecutor()
    try:
        why = ex.available()
        assert isinstance(why, str)
        assert "landlock is not enabled" in why
        assert ex.capabilities.mandatory_denies is False
        with pytest.raises(PolicyEngineError) as exc:
            _run(ex, make_profile(world), "print('ran')")
        assert exc.value.code == ErrorCode.PROVIDER_UNAVAILABLE
    finally:
        ex.close()


def test_never_the_implicit_default(local_ex: LocalExecutor, world: Path) -> None:
    """With no proc backend loaded but `local` (executor_proc failed to load, say), proc.exec
    is not served by it unless configured: the local runner is never picked by itself."""
    cfg = EngineConfig(state_dir=world / "state", mode="compat")
    sel = select({"local": local_ex}, cfg, make_profile(world), OpKind.PROC_EXEC)
    assert sel.executor is None
    assert sel.error is not None
    assert sel.error.code == ErrorCode.PROVIDER_UNAVAILABLE
    named = EngineConfig(state_dir=world / "state", mode="compat",
                         backends={OpKind.PROC_EXEC: "local"})
    assert select({"local": local_ex}, named, make_profile(world),
                  OpKind.PROC_EXEC).executor is local_ex


def test_conformance_kit_compat_passes_and_strict_refuses() -> None:
    # the installed entry point (scripts/test.sh installs the package), as users get it
    assert any(ep.name == "executor_local" for ep in entry_points(group="policy_engine.plugins"))
    compat = {r.id: r for r in run_suite("local", mode="compat").results}
    assert {cid: r.message for cid, r in compat.items() if r.status == "fail"} == {}
    assert compat["compat.degraded-recorded"].status == "pass"
    assert compat["claims.no-orphans"].status == "pass"
    assert compat["claims.network-off"].status == "n/a"  # it does not claim it
    for cid in ("claims.writes-confined", "claims.no-setid-plant", "claims.not-host-root",
                "claims.ipc-isolated"):
        assert compat[cid].status == "pass", (cid, compat[cid].message)
    strict = {r.id: r for r in run_suite("local", mode="strict").results}
    assert strict["capabilities.runs[proc.exec]"].status == "fail"
    assert "SANDBOX.CAPABILITY_BLOCKED" in strict["capabilities.runs[proc.exec]"].message \
        or "lacks" in strict["capabilities.runs[proc.exec]"].message


# ---- through the CLI: strict refuses, compat degrades, fallback_to_local --------------------

POLICY = """policy "local/runner" version "1.0.0"
defaults {
  timeout 20s
  network off
}
permit "read-ws" fs.read, fs.list paths ["@ROOT@/**"]
permit "py" proc.exec tool "python3"
require consent when `false`
"""


@pytest.fixture
def cli(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "fs.read", "paths": [f"{root}/**"]}]
    (tmp_path / "p.sbpolicy").write_text(POLICY.replace("@ROOT@", str(root)))
    (tmp_path / "grant.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "rt", "call_id": "c-1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 10}}))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "name": "rt", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Process", "Read"], "safety_class": "Medium"}))
    return tmp_path


def _cli(tmp: Path, config: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    (tmp / "engine.yaml").write_text(f"state_dir: {tmp / 'state'}\n{config}")
    env = dict(os.environ)
    res = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--config", str(tmp / "engine.yaml"),
         "--policy", str(tmp / "p.sbpolicy"), "--manifest", str(tmp / "manifest.json"),
         "--grant", str(tmp / "grant.json"), "--", "python3", "-c",
         "import os; print('ran-as', os.geteuid())"],
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp, env=env)
    assert "Traceback" not in res.stderr, res.stderr
    lines = (tmp / "state" / "evidence" / "evidence.jsonl").read_text().splitlines()
    # the last end record (a closed log ends with its signed checkpoint)
    return res, [r for r in map(json.loads, lines) if r.get("type") == "end"][-1]


def test_strict_mode_refuses_the_local_runner(cli: Path) -> None:
    res, end = _cli(cli, "mode: strict\nbackends:\n  proc.exec: local\n")
    assert "SANDBOX.CAPABILITY_BLOCKED" in res.stdout, res.stdout
    assert "ran-as" not in res.stdout
    assert end["error_code"] == "SANDBOX.CAPABILITY_BLOCKED"
    assert end["sandbox_backend"] == "local"


def test_compat_mode_runs_it_degraded_naming_what_it_lacks(cli: Path) -> None:
    res, end = _cli(cli, "mode: compat\nbackends:\n  proc.exec: local\n")
    assert "ran-as 65533" in res.stdout, res.stdout + res.stderr
    assert end["status"] == "ok"
    assert end["sandbox_backend"] == "local"
    assert end["sandbox_degraded"] is True
    reason = str(end["sandbox_degrade_reason"])
    for lack in ("`bind_mounts`", "`network_modes:off`", "local runner"):
        assert lack in reason, reason


def test_fallback_to_local_only_when_asked(cli: Path) -> None:
    no_bwrap = "options:\n  proc: {bwrap: /nonexistent/bwrap}\n"
    res, end = _cli(cli, f"mode: compat\n{no_bwrap}")
    assert "PROVIDER.UNAVAILABLE" in res.stdout, res.stdout
    assert "ran-as" not in res.stdout
    assert end["sandbox_backend"] == "proc-bwrap"
    res, end = _cli(cli, f"mode: compat\nfallback_to_local: true\n{no_bwrap}")
    assert "ran-as 65533" in res.stdout, res.stdout + res.stderr
    assert end["sandbox_backend"] == "local"
    assert end["sandbox_degraded"] is True
    assert "fell back to local backend `local`" in str(end["sandbox_degrade_reason"])
    # strict mode refuses the fallback too: the local runner lacks what the profile needs
    res, end = _cli(cli, f"mode: strict\nfallback_to_local: true\n{no_bwrap}")
    assert "SANDBOX.CAPABILITY_BLOCKED" in res.stdout
    assert "ran-as" not in res.stdout
