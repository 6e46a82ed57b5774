"""Sandbox escapes of issue 11, run for real: setuid plants checked from the host as uid 65534,
host control sockets behind a real listener, the host's /etc/passwd (items 1, 2 and 11)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from plugins.executor_docker.workspace import SANDBOX_UID, project_id_of
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from plugins.executor_proc.synthetic_etc import SYNTHETIC_ETC
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import FsCapability, Mappings, ProcExecOp, Profile, ProfileCapability
from tests.integration.test_docker_executor import make_profile as docker_profile
from tests.integration.test_proc_sandbox import make_profile

BACKENDS = ["bwrap", "landlock"]
PYTHON = os.path.realpath(sys.executable)
SYSTEM_PYTHON = "/usr/bin/python3.11"  # runs as uid 65534 (the test's own lives under /root)
PLANT = textwrap.dedent("""
    import json, os, shutil, stat, sys
    out, src, res = sys.argv[1], sys.argv[2], {}
    def plant(how, p):
        if how == "chmod":
            shutil.copyfile(src, p); os.chmod(p, 0o755); os.chmod(p, 0o4755)
        elif how == "fchmod":
            shutil.copyfile(src, p); fd = os.open(p, os.O_RDONLY); os.fchmod(fd, 0o6755)
        elif how == "open-create":
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o4755)
            os.write(fd, open(src, "rb").read()); os.close(fd)
        elif how == "mknod-suid":
            os.mknod(p, stat.S_IFREG | 0o4755)
        elif how == "mknod-char":
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    for how in ("chmod", "fchmod", "open-create", "mknod-suid", "mknod-char"):
        try:
            plant(how, f"{out}/{how}")
            res[how] = "ok"
        except OSError as e:
            res[how] = e.errno
    print(json.dumps(res))
""")


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    made = {b: ProcExecutor(b) for b in BACKENDS}
    made["bwrap-no-layer2"] = ProcExecutor("bwrap", ProcOptions(layer2=False))
    made["landlock-python"] = ProcExecutor("landlock", ProcOptions(launcher="python"))
    made["bwrap-python"] = ProcExecutor("bwrap", ProcOptions(launcher="python"))
    yield made
    for ex in made.values():
        ex.close()


@pytest.fixture
def world_root() -> Iterator[Path]:
    """A root uid 65534 can traverse (pytest's tmp dirs are 0700)."""
    r = Path(tempfile.mkdtemp(prefix="pe-escape-", dir="/tmp"))
    r.chmod(0o755)
    (r / "out").mkdir(mode=0o755)
    (r / "home").mkdir()
    yield r
    shutil.rmtree(r, ignore_errors=True)


NO_IDMAP = {"bwrap-no-layer2", "bwrap-python", "landlock-python"}
"""Variants that cannot carry an id-mapped bind (no launcher seccomp layer refusing set-id modes,
or no native launcher): a root-owned writable tree is refused in strict mode (issue 26)."""


def _sandbox_owned(path: Path, backend: str = "") -> None:
    """Give ``path`` to the sandbox uid, as if an earlier call had made it, for a test of
    something else than the root-owned tree (which the variants in NO_IDMAP refuse)."""
    if not backend or backend in NO_IDMAP:
        os.chown(path, 65533, 65533)


def _run(ex: ProcExecutor, profile: Profile, code: str, *args: str) -> dict[str, object]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
    return ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", code, *args))).out


def _as_nobody(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(path), "-c",
         "import os; print(os.getuid(), os.geteuid())"],
        capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("backend", [*BACKENDS, "bwrap-no-layer2"])
def test_nothing_planted_in_a_writable_bind_is_setuid_or_a_device_on_the_host(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    _sandbox_owned(world_root / "out", backend)
    out = _run(executors[backend], make_profile(world_root), PLANT, str(world_root / "out"),
               SYSTEM_PYTHON)
    assert out["exit_code"] == 0, out["stderr"]
    planted = list((world_root / "out").iterdir())
    for p in planted:
        mode = os.lstat(p).st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (p.name, oct(mode), out["stdout"])
        assert not stat.S_ISCHR(mode), p.name
        assert not stat.S_ISBLK(mode), p.name
    copy = world_root / "out" / "chmod"
    assert copy.exists()  # the copy itself is allowed, only the setuid bit is not
    ran = _as_nobody(copy)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["65534", "65534"]  # euid is not 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_red_team_shell_plant_fails_inside_the_sandbox(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    target = world_root / "out" / "rootpy"
    ctx = ExecContext(profile=make_profile(world_root), deadline=time.monotonic() + 60)
    out = executors[backend].execute(ctx, ProcExecOp(tool="/bin/sh", args=(
        "-c", f"cp {SYSTEM_PYTHON} {target} && chmod 4755 {target}"))).out
    assert out["exit_code"] != 0
    assert not os.stat(target).st_mode & stat.S_ISUID
    assert _as_nobody(target).stdout.split()[1] == "65534"


@contextlib.contextmanager
def listener() -> Iterator[tuple[str, list[bytes]]]:
    """A real unix listener where docker keeps containerd's socket (/run/docker/containerd/),
    inside the `/run/docker/**` the policy allows; the real /run/docker.sock is probed too."""
    made_dir = f"/run/docker/pe-test-{uuid.uuid4().hex[:8]}"
    os.makedirs(made_dir, 0o755)
    path = f"{made_dir}/containerd.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o666)
    srv.listen(8)
    got: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                got.append(conn.recv(100))
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nversion")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield path, got
    finally:
        srv.close()
        os.unlink(path)
        os.rmdir(made_dir)


PROBE = textwrap.dedent("""
    import socket, sys
    for p in sys.argv[1:]:
        try:
            s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(p)
            s.sendall(b"GET /version HTTP/1.0\\r\\n\\r\\n"); print("CONNECTED", p, s.recv(40))
        except Exception as e:
            print("blocked", p, type(e).__name__)
""")


def _root_profile(globs: tuple[str, ...]) -> Profile:
    base = make_profile(Path("/tmp"))
    caps = tuple(ProfileCapability(kind=k, all_of=(FsCapability(kind=k, paths=globs),))
                 for k in ("fs.read", "fs.list"))
    return base.model_copy(update={"capabilities": caps, "mappings": Mappings(
        root_fs="/", tmp_dir="/tmp", home="/root")})


@pytest.mark.parametrize(("backend", "globs"), [
    ("bwrap", ("/run/docker/**", "/run/**", "/var/run/**")),
    ("bwrap", ("/**",)),
    ("landlock", ("/**",)),
])
def test_no_host_control_socket_is_reachable_whatever_root_fs_and_rules_say(
        executors: dict[str, ProcExecutor], backend: str, globs: tuple[str, ...]) -> None:
    with listener() as (path, got):
        # the listener is real: the host connects
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"ping")
            assert s.recv(20).startswith(b"HTTP/1.0 200")
        refused: PolicyEngineError | None = None
        try:
            out = _run(executors[backend], _root_profile(globs), PROBE, path,
                       "/run/docker.sock", "/var/run/docker.sock")
        except PolicyEngineError as exc:
            refused = exc
    if refused is not None:
        # Landlock carves every masked path out of `/**`: on a host with thousands of secrets
        # (a busy /tmp) that is refused, cleanly, before anything runs
        assert backend == "landlock", refused
        assert refused.code == ErrorCode.CAPABILITY_BLOCKED
        assert "Landlock rules" in refused.reason
        assert got == [b"ping"]
        return
    assert out["exit_code"] == 0, out["stderr"]
    assert "CONNECTED" not in str(out["stdout"]), out["stdout"]
    assert str(out["stdout"]).count("blocked") == 3
    assert got == [b"ping"]  # only the host's own connection arrived


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_hosts_passwd_and_group_are_not_shown(
        executors: dict[str, ProcExecutor], backend: str) -> None:
    code = textwrap.dedent("""
        import json
        out = {}
        for p in ("/etc/passwd", "/etc/group"):
            try:
                out[p] = open(p).read()
            except OSError as e:
                out[p] = e.errno
        print(json.dumps(out))
    """)
    out = _run(executors[backend], _root_profile(("/etc/**", "/usr/**")), code)
    seen = json.loads(str(out["stdout"]))
    host = Path("/etc/passwd").read_text()
    assert "daemon:" in host  # the host list has more than the synthetic one
    for path, content in seen.items():
        if backend == "bwrap":
            assert content == SYNTHETIC_ETC[path]
        else:
            assert isinstance(content, int)  # hidden under Landlock (no mount namespace)


@pytest.mark.parametrize("backend", BACKENDS)
def test_writing_2_gib_in_one_call_fails_with_a_clean_code(world_root: Path,
                                                           backend: str) -> None:
    quota = 64 << 20
    ex = ProcExecutor(backend, ProcOptions(max_file_bytes=quota))
    big = world_root / "out" / "big.bin"
    ctx = ExecContext(profile=make_profile(world_root), deadline=time.monotonic() + 60)
    try:
        with pytest.raises(PolicyEngineError) as exc:  # dd is killed by SIGXFSZ
            ex.execute(ctx, ProcExecOp(tool="/bin/dd", args=(
                "if=/dev/zero", f"of={big}", "bs=1M", "count=2048")))
        assert big.stat().st_size <= quota
        # Python ignores SIGXFSZ: its write fails with EFBIG instead, the file still capped
        out = _run(ex, make_profile(world_root), textwrap.dedent("""
            import sys
            with open(sys.argv[1], "wb") as fh:
                for _ in range(2048):
                    fh.write(b"\\0" * (1 << 20))
        """), str(world_root / "out" / "big2.bin"))
    finally:
        ex.close()
    assert exc.value.code == ErrorCode.BUDGET_EXCEEDED
    assert "max_file_bytes" in exc.value.reason
    assert out["exit_code"] != 0
    assert "File too large" in str(out["stderr"])
    assert (world_root / "out" / "big2.bin").stat().st_size <= quota


# --- docker: the same attacks against containers ------------------------------------------------

@pytest.fixture(scope="module")
def docker_state() -> Iterator[Path]:
    """The executor's state directory: projects live beneath it, outside every root_fs."""
    d = Path(tempfile.mkdtemp(prefix="pe-escape-state-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def docker_ex(docker_state: Path) -> Iterator[DockerExecutor]:
    ex = DockerExecutor(DockerOptions(max_file_bytes=64 << 20), state_dir=docker_state)
    yield ex
    ex.close()


def _project(ex: DockerExecutor, ctx: ExecContext) -> Path:
    return ex.state_dir / "docker" / "projects" / project_id_of(ctx.profile)


def _docker_ctx(root: Path) -> ExecContext:
    base = docker_profile(root)
    denies = make_profile(root).denies  # the mandatory `**/.env`, `~/.ssh/**`…
    return ExecContext(profile=base.model_copy(update={"denies": denies}),
                       deadline=time.monotonic() + 90)


def test_docker_refuses_io_uring(docker_ex: DockerExecutor, world_root: Path) -> None:
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        params = ctypes.create_string_buffer(120)
        fd = libc.syscall(425, 8, params)
        print(fd, ctypes.get_errno())
    """)
    res = docker_ex.execute(_docker_ctx(world_root), ProcExecOp(tool="python3",
                                                                 args=("-c", code)))
    assert res.out["stdout"].split() == ["-1", str(errno.EPERM)]


OPENAT2 = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, 0o6755, 0)  # struct open_how
    fd = libc.syscall(437, -100, sys.argv[1].encode(), how, ctypes.sizeof(how))
    print(fd if fd >= 0 else -ctypes.get_errno())
""")


def test_docker_plant_is_not_setuid_root_on_the_host(docker_ex: DockerExecutor,
                                                     world_root: Path) -> None:
    res = docker_ex.execute(_docker_ctx(world_root), ProcExecOp(tool="/bin/sh", args=(
        "-c", f"cp {SYSTEM_PYTHON} /workspace/work/rootpy; chmod 4755 /workspace/work/rootpy; "
        "echo chmod=$?")))
    assert "chmod=1" in res.out["stdout"]  # refused by the profile's seccomp rules
    planted = _project(docker_ex, _docker_ctx(world_root)) / "work" / "rootpy"
    st = planted.stat()
    assert st.st_uid == SANDBOX_UID
    assert not st.st_mode & stat.S_ISUID
    assert _as_nobody(planted).stdout.split()[1:] != ["0"]


def test_docker_plants_no_setid_file_or_device_a_host_account_can_run(
        docker_ex: DockerExecutor, world_root: Path) -> None:
    """Outsider F7: uid 1000 is a real host account; nothing the container writes to work/ may
    be set-id or a device, and no other host account may reach work/ at all."""
    ctx = _docker_ctx(world_root)
    res = docker_ex.execute(ctx, ProcExecOp(tool="python3", args=(
        "-c", PLANT, "/workspace/work", SYSTEM_PYTHON)))
    tried = json.loads(res.out["stdout"])
    assert tried == dict.fromkeys(("chmod", "fchmod", "open-create", "mknod-suid",
                                   "mknod-char"), errno.EPERM), tried
    res = docker_ex.execute(_docker_ctx(world_root), ProcExecOp(tool="python3", args=(
        "-c", OPENAT2, "/workspace/work/openat2")))
    assert res.out["stdout"].split() == [str(-errno.ENOSYS)]  # libc falls back to openat
    project = _project(docker_ex, ctx)
    for p in (project / "work").iterdir():
        mode = os.lstat(p).st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (p.name, oct(mode))
        assert not stat.S_ISCHR(mode), p.name
        assert not stat.S_ISBLK(mode), p.name
    assert stat.S_IMODE(project.stat().st_mode) == 0o700
    # another account runs the plain copy: execve from a process already running as uid 65534
    # (setpriv itself execs with its capabilities still effective, so it would walk past 0700)
    ran = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON, "-c",
         "import os, sys; os.execv(sys.argv[1], [sys.argv[1], '-c', 'print(\"ran\")'])",
         str(project / "work" / "chmod")],
        capture_output=True, text=True, timeout=30, check=False)
    assert "ran" not in ran.stdout
    assert "PermissionError" in ran.stderr, ran.stderr


def test_docker_sweeps_setid_bits_and_devices_left_in_work(docker_ex: DockerExecutor,
                                                          world_root: Path) -> None:
    """The third line: a set-id file or device node in work/ (a kernel path seccomp does not
    know, an older engine) is cleared after the next run; symlinks are never followed."""
    ctx = _docker_ctx(world_root)
    docker_ex.execute(ctx, ProcExecOp(tool="true"))
    work = _project(docker_ex, ctx) / "work"
    (work / "sub").mkdir(exist_ok=True)
    for name in ("suid", "sub/sgid"):
        (work / name).write_bytes(b"#!/bin/sh\n")
    os.chmod(work / "suid", 0o4755)
    os.chmod(work / "sub/sgid", 0o2755)
    os.mknod(work / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    outside = world_root / "out" / "host-suid"
    outside.write_bytes(b"x")
    os.chmod(outside, 0o4755)
    (work / "link").symlink_to(outside)
    res = docker_ex.execute(_docker_ctx(world_root), ProcExecOp(tool="true"))
    assert stat.S_IMODE((work / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((work / "sub/sgid").stat().st_mode) == 0o755
    assert not (work / "null").exists()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755  # not followed
    meta = json.loads((Path(res.out["artifacts_dir"]) / "meta.json").read_text())
    assert sorted(meta["setid_stripped"]) == ["work/null", "work/sub/sgid", "work/suid"]


def test_docker_disk_quota_and_masks(docker_ex: DockerExecutor, world_root: Path) -> None:
    ctx = _docker_ctx(world_root)
    docker_ex.execute(ctx, ProcExecOp(tool="true"))  # creates the project's directories
    work = _project(docker_ex, ctx) / "work"
    (work / ".env").write_text("TOKEN=docker-env-secret")
    res = docker_ex.execute(_docker_ctx(world_root), ProcExecOp(tool="/bin/sh", args=(
        "-c", "cat /workspace/work/.env; echo rc=$?")))
    assert "docker-env-secret" not in res.out["stdout"]
    with pytest.raises(PolicyEngineError) as exc:
        # not as PID 1, which ignores SIGXFSZ (it then gets EFBIG, the file capped alike)
        docker_ex.execute(_docker_ctx(world_root), ProcExecOp(tool="/bin/sh", args=(
            "-c", "dd if=/dev/zero of=/workspace/work/big bs=1M count=2048; exit $?")))
    assert exc.value.code == ErrorCode.BUDGET_EXCEEDED
    assert (work / "big").stat().st_size <= 64 << 20


CLI_POLICY = """policy "escape/proc" version "1.0.0"
defaults {
  timeout 20s
  network off
}
permit "read-ws" fs.read, fs.list paths ["@ROOT@/**"]
permit "py" proc.exec tool "python3"
require consent when `false`
"""


def test_cli_landlock_compat_cannot_reach_the_docker_socket(tmp_path: Path) -> None:
    """The red team's F6(b) through the CLI: proc-landlock in compat mode, GET /version."""
    root = tmp_path / "ws"
    root.mkdir()
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "fs.read", "paths": [f"{root}/**"]}]
    (tmp_path / "p.sbpolicy").write_text(CLI_POLICY.replace("@ROOT@", str(root)))
    (tmp_path / "grant.json").write_text(json.dumps({
        "tenant": "red", "subject_id": "agent:rt-1", "tool_name": "rt", "call_id": "c-1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 10}}))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "name": "rt", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Process", "Read"], "safety_class": "Medium"}))
    (tmp_path / "engine.yaml").write_text(
        f"state_dir: {tmp_path / 'state'}\nbackends:\n  proc.exec: proc-landlock\nmode: compat\n")
    probe = textwrap.dedent("""
        import socket
        for p in ("/var/run/docker.sock", "/run/docker.sock"):
            try:
                s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(p)
                s.sendall(b"GET /version HTTP/1.0\\r\\n\\r\\n"); print("CONNECTED", s.recv(20))
            except OSError as e:
                print("blocked", p, e.errno)
    """)
    assert os.path.exists("/var/run/docker.sock")  # the real daemon socket is there to reach
    res = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--config",
         str(tmp_path / "engine.yaml"), "--policy", str(tmp_path / "p.sbpolicy"), "--manifest",
         str(tmp_path / "manifest.json"), "--grant", str(tmp_path / "grant.json"), "--",
         "python3", "-c", probe],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert "Traceback" not in res.stderr
    assert "backend proc-landlock" in res.stdout, res.stdout + res.stderr
    assert "CONNECTED" not in res.stdout
    assert res.stdout.count("blocked") == 2, res.stdout


def test_docker_warm_pool_leaves_mandatory_denied_inputs_out(world_root: Path,
                                                             docker_state: Path) -> None:
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1), state_dir=docker_state)
    try:
        ctx = _docker_ctx(world_root)
        inputs = _project(ex, ctx) / "inputs"
        (inputs / "cfg").mkdir(parents=True)
        (inputs / "cfg" / ".env").write_text("TOKEN=pool-env-secret")
        (inputs / "cfg" / "ok.txt").write_text("fine")
        res = ex.execute(ctx, ProcExecOp(tool="/bin/sh", args=(
            "-c", "ls -a /workspace/inputs/cfg; cat /workspace/inputs/cfg/.env")))
    finally:
        ex.close()
    assert "ok.txt" in res.out["stdout"]
    assert ".env" not in res.out["stdout"]
    assert "pool-env-secret" not in res.out["stdout"]


# --- outsider attack F15: a symlink in a carved tree must not widen the Landlock rules ----------

READ_ALL = textwrap.dedent("""
    import json, sys
    out = {}
    for p in sys.argv[1:]:
        try:
            out[p] = open(p).read()
        except OSError as e:
            out[p] = e.errno
    print(json.dumps(out))
""")


@pytest.mark.parametrize("backend", [*BACKENDS, "landlock-python"])
def test_symlinks_planted_in_a_carved_tree_grant_nothing_beyond_the_policy(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    """F15: the tree holding a masked ``.env`` is carved entry by entry; a planted link to /etc,
    to the ``.env`` or to a directory outside the policy must not become a rule for its target.
    """
    _sandbox_owned(world_root / "out", backend)
    outside = Path(tempfile.mkdtemp(prefix="pe-outside-", dir="/tmp"))
    try:
        outside.chmod(0o755)
        (outside / "o.txt").write_text("OUTSIDE_SECRET_15")
        (outside / "o.txt").chmod(0o644)
        work = world_root / "out"
        (work / ".env").write_text("SECRET_ENV=hunter15")  # mandatory deny: carves out/
        (work / "ok.txt").write_text("fine")
        for name, target in (("l_outdir", outside), ("l_out", outside / "o.txt"),
                             ("l_env", work / ".env"), ("l_etc", Path("/etc"))):
            (work / name).symlink_to(target)
        targets = [str(work / ".env"), str(outside / "o.txt"), str(work / "ok.txt")]
        seen = json.loads(str(_run(executors[backend], make_profile(world_root), READ_ALL,
                                   *targets)["stdout"]))
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    assert seen[str(work / "ok.txt")] == "fine"
    assert isinstance(seen[str(work / ".env")], int), seen
    assert isinstance(seen[str(outside / "o.txt")], int), seen


# --- outsider attack F2(a): what the host keeps from other users stays out of every sandbox -----

@pytest.fixture
def root_only_etc() -> Iterator[Path]:
    """A directory in host /etc holding a 0600 root-only key, a 0700 directory and a
    world-readable file (the control)."""
    d = Path(f"/etc/pe-f2-{uuid.uuid4().hex[:8]}")
    d.mkdir(mode=0o755)
    (d / "key.json").write_text('{"d":"ROOT_ONLY_KEY_F2"}')
    (d / "key.json").chmod(0o600)
    (d / "private").mkdir(mode=0o700)
    (d / "private" / "inner.txt").write_text("INNER_F2")
    (d / "private" / "inner.txt").chmod(0o644)
    (d / "public.txt").write_text("PUBLIC_F2")
    (d / "public.txt").chmod(0o644)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("backend", [*BACKENDS, "bwrap-no-layer2"])
def test_root_only_host_files_in_system_trees_are_not_readable(
        executors: dict[str, ProcExecutor], world_root: Path, root_only_etc: Path,
        backend: str) -> None:
    _sandbox_owned(world_root / "out", backend)
    d = root_only_etc
    paths = [str(d / "key.json"), str(d / "private" / "inner.txt"), str(d / "public.txt")]
    seen = json.loads(str(_run(executors[backend], make_profile(world_root), READ_ALL,
                               *paths)["stdout"]))
    assert seen[str(d / "public.txt")] == "PUBLIC_F2"  # /etc itself is still there
    assert isinstance(seen[str(d / "key.json")], int), seen
    assert isinstance(seen[str(d / "private" / "inner.txt")], int), seen
    # a chmod changes only the file's ctime, not its directory's: the next plan still sees it
    (d / "public.txt").chmod(0o600)
    again = json.loads(str(_run(executors[backend], make_profile(world_root), READ_ALL,
                                str(d / "public.txt"))["stdout"]))
    assert isinstance(again[str(d / "public.txt")], int), again


# --- issue 11 item 1 / outsider F2: the sandboxed process is not host uid 0 ---------------------

WHO = textwrap.dedent("""
    import json, os, sys
    open(sys.argv[1], "w").write("made inside")
    try:  # proc-landlock shows no /proc at all: its euid is the host's
        uid_map, fds = open("/proc/self/uid_map").read(), sorted(os.listdir("/proc/self/fd"))
    except OSError:
        uid_map, fds = "", None
    print(json.dumps({"uid_map": uid_map, "euid": os.geteuid(), "fds": fds}))
""")


def _host_uid(uid_map: str, euid: int) -> int:
    """The host uid ``euid`` maps to (``inside outside count`` lines; none: no namespace)."""
    if not uid_map:
        return euid
    for line in uid_map.splitlines():
        inside, outside, count = (int(x) for x in line.split())
        if inside <= euid < inside + count:
            return outside + euid - inside
    raise AssertionError(f"euid {euid} is not mapped by {uid_map!r}")


@pytest.mark.parametrize("backend", ["bwrap", "bwrap-no-layer2", "bwrap-python", "landlock",
                                     "landlock-python"])
def test_the_sandboxed_process_is_not_host_root(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    _sandbox_owned(world_root / "out")  # the uid is tested here; a root tree: below
    made = world_root / "out" / "made.txt"
    out = _run(executors[backend], make_profile(world_root), WHO, str(made))
    assert out["exit_code"] == 0, out["stderr"]
    seen = json.loads(str(out["stdout"]))
    assert _host_uid(seen["uid_map"], seen["euid"]) != 0, seen
    st = os.lstat(made)  # checked from the host: what it leaves is not root's
    assert st.st_uid != 0, st.st_uid
    assert st.st_gid != 0, st.st_gid
    assert made.read_text() == "made inside"  # the engine (root) still reads it
    assert seen["fds"] in (["0", "1", "2", "3"], None), seen  # no stray descriptor inside
    assert (seen["fds"] is None) == backend.startswith("landlock")


@pytest.mark.parametrize("backend", ["bwrap", "bwrap-no-layer2", "bwrap-python", "landlock",
                                     "landlock-python"])
def test_in_a_root_owned_tree_the_process_is_still_not_host_root(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    """A tree root owns is written through an id-mapped bind (issue 26: no chown of the user's
    files): the process is still the unprivileged sandbox uid, and what it leaves is root's, the
    invoking user's, as the issue asks (set-id modes: refused by the required seccomp layer,
    test_idmapped_binds). A variant that cannot carry the mapping refuses in strict mode."""
    made = world_root / "out" / "made.txt"
    if backend in NO_IDMAP:
        with pytest.raises(PolicyEngineError) as refused:
            _run(executors[backend], make_profile(world_root), WHO, str(made))
        assert refused.value.code is ErrorCode.CAPABILITY_BLOCKED
        assert "no id-mapped bind" in str(refused.value)
        assert not made.exists()
        assert (world_root / "out").stat().st_uid == 0
        return
    out = _run(executors[backend], make_profile(world_root), WHO, str(made))
    assert out["exit_code"] == 0, out["stderr"]
    seen = json.loads(str(out["stdout"]))
    assert _host_uid(seen["uid_map"], seen["euid"]) == 65533, seen
    st = os.lstat(made)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o6000) == (0, 0, 0)
    assert (world_root / "out").stat().st_uid == 0


@pytest.mark.parametrize("backend", ["bwrap", "bwrap-no-layer2", "landlock"])
def test_a_setuid_copy_the_sandbox_leaves_gives_nobody_no_root(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    """Even if a set-uid bit survived (a layer that strips it failed), the copy belongs to the
    sandbox's unprivileged uid: ``nobody`` running it gets that uid, never euid 0. In a tree
    root owns the copy is root's by design (written through an id-mapped bind, issue 26): there
    the seccomp layer is required and no set-id mode gets through (test_idmapped_binds)."""
    _sandbox_owned(world_root / "out")  # the uid is tested here; a root tree: below
    copy = world_root / "out" / "rootpy"
    out = _run(executors[backend], make_profile(world_root),
               "import shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2])",
               SYSTEM_PYTHON, str(copy))
    assert out["exit_code"] == 0, out["stderr"]
    owner = os.lstat(copy).st_uid
    assert owner != 0
    os.chmod(copy, 0o4755)  # the worst case, done by the host itself
    ran = _as_nobody(copy)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["65534", str(owner)]  # euid is the sandbox's uid, not 0


EDIT = textwrap.dedent("""
    import json, sys
    out = {}
    for p in sys.argv[1:]:
        try:
            with open(p, "a") as fh:
                fh.write("+edit")
            out[p] = "ok"
        except OSError as e:
            out[p] = e.errno
    print(json.dumps(out))
""")


def test_root_owned_workspace_files_stay_editable_and_links_keep_their_owner(
        executors: dict[str, ProcExecutor], world_root: Path, root_only_etc: Path) -> None:
    """What root left in a writable bind stays editable and root's: the bind is id-mapped, root
    shown as the sandbox uid, no owner changes (issue 26); a symlink or a hard link to a host
    file (bound read-only from the plain tree), and a masked secret, are not."""
    out_dir = world_root / "out"
    (out_dir / "sub").mkdir()
    kept = out_dir / "sub" / "by-root.txt"
    kept.write_text("root wrote this")
    (out_dir / "to-key").symlink_to(root_only_etc / "key.json")
    host_file = world_root / "host-file.txt"  # outside the writable bind, same file system
    host_file.write_text("host")
    os.link(host_file, out_dir / "hard")
    (out_dir / ".env").write_text("SECRET=1")
    seen = json.loads(str(_run(executors["bwrap"], make_profile(world_root), EDIT, str(kept),
                               str(out_dir / "hard"), str(out_dir / "to-key"))["stdout"]))
    assert seen[str(kept)] == "ok", seen
    assert kept.read_text() == "root wrote this+edit"
    assert isinstance(seen[str(out_dir / "hard")], int), seen  # a name outside: read-only
    assert isinstance(seen[str(out_dir / "to-key")], int), seen
    assert os.stat(root_only_etc / "key.json").st_uid == 0
    assert (root_only_etc / "key.json").read_text() == '{"d":"ROOT_ONLY_KEY_F2"}'
    assert os.stat(host_file).st_uid == 0
    assert os.stat(out_dir / ".env").st_uid == 0  # masked: keeps its owner
    assert (host_file.read_text(), os.stat(host_file).st_mode & 0o777) == ("host", 0o644)
    assert os.stat(kept).st_uid == os.stat(out_dir / "sub").st_uid == 0  # nothing handed over


@pytest.mark.parametrize("bad", [[0, 0], [65533, 0], [-1, 5], [1.5, 2], "65533", [1, 2, 3]])
def test_run_as_must_be_an_unprivileged_uid_and_gid(bad: object) -> None:
    with pytest.raises(ValueError, match="run_as"):
        ProcOptions.parse({"run_as": bad})


SHM = textwrap.dedent("""
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    key, create = int(sys.argv[1]), sys.argv[2] == "create"
    shmid = libc.shmget(key, 4096, (0o1000 | 0o600) if create else 0)  # IPC_CREAT
    print(shmid, ctypes.get_errno())
""")


@pytest.mark.parametrize("backend", ["landlock", "landlock-python"])
def test_a_sysv_segment_of_one_landlock_call_is_not_seen_by_the_next_or_the_host(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    _sandbox_owned(world_root / "out", backend)
    key = 0x5E000000 + (os.getpid() & 0xFFFF)
    made = _run(executors[backend], make_profile(world_root), SHM, str(key), "create")
    assert made["exit_code"] == 0, made["stderr"]
    assert int(str(made["stdout"]).split()[0]) >= 0, made["stdout"]  # it was created
    seen = _run(executors[backend], make_profile(world_root), SHM, str(key), "look")
    assert str(seen["stdout"]).split() == ["-1", str(errno.ENOENT)], seen["stdout"]
    host_keys = {int(line.split()[0]) for line in
                 Path("/proc/sysvipc/shm").read_text().splitlines()[1:]}
    assert key not in host_keys


# --- outsider attack F9 on proc: git runs no program a workspace file names ------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_git_in_a_proc_sandbox_runs_no_program_the_workspace_names(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    """A repository the agent wrote (the guard refuses writes to .git/config, but a bare
    repository needs no `.git` segment) names an fsmonitor program; `git status` must not run
    it: the executor pins git's configuration (GIT_PINS)."""
    out = world_root / "out"
    script = out / "monitor.sh"
    script.write_text(f"#!/bin/sh\necho ran >> {out}/RAN\n")
    script.chmod(0o755)
    repo = out / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    (repo / "a.txt").write_text("a")
    subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", str(script)],
                   check=True, timeout=30)
    subprocess.run(["git", "-C", str(repo), "config", "safe.directory", "*"], check=True,
                   timeout=30)
    for dirpath, dirnames, filenames in os.walk(out):  # as if the sandbox had made them
        for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
            os.lchown(name, 65533, 65533)
    ctx = ExecContext(profile=make_profile(world_root), deadline=time.monotonic() + 60)
    result = executors[backend].execute(ctx, ProcExecOp(tool="git", args=("status",),
                                                        cwd=str(repo)))
    assert result.out["exit_code"] == 0, result.out
    assert not (out / "RAN").exists()


# --- outsider attack round 2, F1: a plain forbid holds inside the sandbox too --------------

@pytest.mark.parametrize("backend", [*BACKENDS, "bwrap-no-layer2"])
def test_plain_forbids_of_reads_and_writes_hold_for_a_permitted_process(
        executors: dict[str, ProcExecutor], world_root: Path, backend: str) -> None:
    """`forbid fs.write paths [".../release/**"]` and `forbid fs.read paths [".../priv/**"]`
    (not mandatory) under a writable bind: a permitted python process can neither edit the
    release files nor read the private one, and adopt leaves the forbidden tree root's."""
    from policy_engine.model import CapabilityKind, FsCapability, ProfileDeny, RuleRef

    out = world_root / "out"
    (out / "release").mkdir()
    (out / "release" / "NOTES").write_text("v1\n")
    (out / "priv").mkdir()
    (out / "priv" / "key.txt").write_text("PRIV-MARKER-R2F1\n")
    (out / "free.txt").write_text("ok\n")
    if backend in NO_IDMAP:  # as if an earlier call had made them (root's tree: refused)
        for made in (out, out / "free.txt"):
            _sandbox_owned(made)
    rule = RuleRef(id="no-release-edits", file="p.sbpolicy", line=3, column=1)
    denies = (
        ProfileDeny(kinds=(CapabilityKind.FS_WRITE,), rule=rule,
                    capability=FsCapability(kind="fs.write", paths=(f"{out}/release/**",))),
        ProfileDeny(kinds=(CapabilityKind.FS_READ,), rule=rule,
                    capability=FsCapability(kind="fs.read", paths=(f"{out}/priv/**",))),
    )
    base = make_profile(world_root)
    profile = base.model_copy(update={"denies": (*base.denies, *denies)})
    code = textwrap.dedent("""
        import json, sys
        seen = {}
        for p in sys.argv[1:3]:
            try:
                open(p, "a").write("tampered\\n"); seen[p] = "written"
            except OSError as e:
                seen[p] = e.errno
        try:
            seen["read"] = open(sys.argv[3]).read()
        except OSError as e:
            seen["read"] = e.errno
        print(json.dumps(seen))
    """)
    result = _run(executors[backend], profile, code, str(out / "release" / "NOTES"),
                  str(out / "free.txt"), str(out / "priv" / "key.txt"))
    seen = json.loads(str(result["stdout"]))
    assert seen[str(out / "free.txt")] == "written"  # the writable bind still works
    assert isinstance(seen[str(out / "release" / "NOTES")], int), seen
    assert (out / "release" / "NOTES").read_text() == "v1\n"
    assert isinstance(seen["read"], int), seen
    assert (out / "release").stat().st_uid == 0  # not handed to the sandbox uid
    assert (out / "release" / "NOTES").stat().st_uid == 0



def test_landlock_refuses_cleanly_when_its_carved_rules_would_overflow(
        executors: dict[str, ProcExecutor], world_root: Path) -> None:
    """A masked `.env` among 4,200 siblings needs one Landlock rule per sibling: more than the
    launcher holds. It was an opaque `usage: sb_launch` with exit 126; now a refusal that
    says why and what to do, before anything runs."""
    crowd = world_root / "crowd"
    crowd.mkdir()
    for i in range(4200):
        (crowd / f"f{i}").touch()
    (crowd / ".env").write_text("SECRET=1\n")
    with pytest.raises(PolicyEngineError) as caught:
        _run(executors["landlock"], make_profile(world_root), "print(1)")
    assert caught.value.code == ErrorCode.CAPABILITY_BLOCKED
    assert "Landlock rules" in caught.value.reason
    assert "proc-bwrap" in caught.value.reason
    out = _run(executors["bwrap"], make_profile(world_root), "print(1)")  # masks by mounts
    assert out["stdout"] == "1\n"
