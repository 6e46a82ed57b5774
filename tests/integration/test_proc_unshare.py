"""proc-unshare (issue 17 item 3, seed 003 test case 10): util-linux `unshare` namespaces around
the Landlock + seccomp launcher, run for real. Each attack is one an outsider would try first;
each names the layer that stops it (checked by removing that layer: the test then fails)."""

from __future__ import annotations

import json
import os
import shutil
import socket
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

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.conformance.suite import run_suite
from policy_engine.executor import ExecContext
from policy_engine.model import NetworkMode, ProcExecOp, Profile
from tests.integration.planted import planted_world
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"  # runs as the sandbox uid (the test's own interpreter may not)


@pytest.fixture(scope="module")
def unshare_ex() -> Iterator[ProcExecutor]:
    ex = ProcExecutor("unshare")
    assert ex.available() is True, ex.unavailable_reason  # util-linux unshare works here
    yield ex
    ex.close()


@pytest.fixture
def world() -> Iterator[Path]:
    """A workspace the sandbox uid can traverse, with a HOME holding planted secrets."""
    with planted_world("pe-unshare-") as r:
        yield r


def _run(ex: ProcExecutor, profile: Profile, code: str, *args: str,
         timeout: float = 60) -> dict[str, object]:
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + timeout)
    return ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", code, *args))).out


def _report(out: dict[str, object]) -> dict[str, object]:
    assert out["exit_code"] == 0, out
    data = json.loads(str(out["stdout"]).strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data


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
    def write(p):
        open(p, "w").write("x"); return "written"
    def unix(p):
        s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(p)
        s.sendall(b"GET /version HTTP/1.0\\r\\n\\r\\n"); return "connected"
    for key, path in json.loads(sys.argv[1]).items():
        kind, _, name = key.partition(":")
        attempt(key, lambda: {"read": read, "write": write, "unix": unix}[kind](path))
    print(json.dumps(R))
""")


def test_secrets_in_the_sandbox_home_and_workspace_stay_unreadable(
        unshare_ex: ProcExecutor, world: Path) -> None:
    """Layer: Landlock carving of the mandatory denies (the files are 0644 on the host)."""
    targets = {"read:ssh": str(world / "home" / ".ssh" / "id_ed25519"),
               "read:env": str(world / ".env"), "read:shadow": "/etc/shadow"}
    seen = _report(_run(unshare_ex, make_profile(world), ATTEMPTS, json.dumps(targets)))
    assert all(str(v).startswith("refused") for v in seen.values()), seen
    assert "marker" not in json.dumps(seen)


@pytest.mark.parametrize("backend", ["landlock", "unshare"])
def test_names_inside_a_masked_directory_stay_hidden(backend: str, world: Path) -> None:
    """Found attacking proc-unshare (and true of proc-landlock): Landlock's list right on a
    carved parent reaches every directory beneath it, so `ls ~/.ssh` named the keys although
    none could be read. Layer: each masked directory is covered by an empty tmpfs in the
    launcher's private mount namespace (root engine), as bwrap does."""
    (world / "home" / ".ssh" / "id_ed25519_prod_db").write_text("k")
    ex = ProcExecutor(backend)  # type: ignore[arg-type]
    code = ("import os, sys\ntry:\n    print(os.listdir(sys.argv[1]))\n"
            "except OSError as e:\n    print('refused', e.errno)")
    try:
        out = _run(ex, make_profile(world), code, str(world / "home" / ".ssh"))
    finally:
        ex.close()
    assert out["exit_code"] == 0, out
    assert "id_ed25519" not in str(out["stdout"]), out


def test_host_control_sockets_are_unreachable(unshare_ex: ProcExecutor, world: Path) -> None:
    """Layer: the seccomp filter refuses AF_UNIX (Landlock does not govern connect()); the
    docker daemon's socket is real here, and a listener inside the workspace is readable."""
    listener_path = str(world / "ctl.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(listener_path)
    os.chmod(listener_path, 0o777)
    srv.listen(4)
    assert os.path.exists("/var/run/docker.sock")
    try:
        targets = {"unix:docker": "/var/run/docker.sock", "unix:run": "/run/docker.sock",
                   "unix:planted": listener_path}
        seen = _report(_run(unshare_ex, make_profile(world), ATTEMPTS, json.dumps(targets)))
    finally:
        srv.close()
    assert not any(v == "connected" for v in seen.values()), seen


def test_writes_outside_the_writable_paths_and_setid_plants_are_refused(
        unshare_ex: ProcExecutor, world: Path) -> None:
    """Layers: Landlock (writes), seccomp and the uid drop (set-id bits)."""
    tag = uuid.uuid4().hex[:8]
    targets = {"write:root": str(world / f"escape-{tag}"), "write:tmp": f"/tmp/escape-{tag}",
               "write:ok": str(world / "out" / "fine")}
    seen = _report(_run(unshare_ex, make_profile(world), ATTEMPTS, json.dumps(targets)))
    assert seen["write:ok"] == "written", seen
    assert str(seen["write:root"]).startswith("refused"), seen
    assert str(seen["write:tmp"]).startswith("refused"), seen
    assert not (world / f"escape-{tag}").exists()
    assert not Path(f"/tmp/escape-{tag}").exists()
    plant = textwrap.dedent("""
        import os, shutil, sys
        p = sys.argv[1]
        shutil.copyfile("/usr/bin/true", p)
        try:
            os.chmod(p, 0o4755); print("chmod ok")
        except OSError as e:
            print("refused", e.errno)
        print("uid", os.geteuid())
    """)
    out = _run(unshare_ex, make_profile(world), plant, str(world / "out" / "suid"))
    assert "refused" in str(out["stdout"]), out
    st = (world / "out" / "suid").stat()
    assert st.st_mode & 0o6000 == 0
    # not host root: the process is the sandbox uid; what it leaves in this root-owned tree is
    # root's, the tree owner's (id-mapped bind, issue 26), without the set-id bits
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert "uid 65533" in str(out["stdout"])


def test_network_off_is_a_namespace_a_loopback_listener_cannot_be_reached(
        unshare_ex: ProcExecutor, world: Path) -> None:
    """Layers: an empty network namespace (checked by its inode), then Landlock TCP rules and
    the seccomp AF_INET refusal on top; the canary is a real listener on the host's loopback."""
    hits: list[bytes] = []
    canary = socket.socket()
    canary.bind(("127.0.0.1", 0))
    canary.listen(4)
    canary.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = canary.accept()
            except OSError:
                continue
            hits.append(conn.recv(64))
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    code = textwrap.dedent("""
        import json, os, socket, sys
        R = {"netns": os.readlink("/proc/self/ns/net"), "pidns": os.readlink("/proc/self/ns/pid"),
             "pid": os.getpid(), "host_pid_seen": os.path.exists(f"/proc/{sys.argv[2]}")}
        try:
            s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
            s.sendall(b"escaped"); R["net"] = "connected"
        except OSError as e:
            R["net"] = "refused"
        print(json.dumps(R))
    """)
    try:
        seen = _report(_run(unshare_ex, make_profile(world), code, str(canary.getsockname()[1]),
                            str(os.getpid())))
    finally:
        stop.set()
        t.join(2)
        canary.close()
    assert seen["net"] == "refused", seen
    assert hits == []
    assert seen["netns"] != os.readlink("/proc/self/ns/net")  # its own, empty namespace
    assert seen["pidns"] != os.readlink("/proc/self/ns/pid")
    assert seen["pid"] == 2  # the launcher is the namespace's init, the tool its child
    assert seen["host_pid_seen"] is False


def test_network_on_shares_the_host_network(unshare_ex: ProcExecutor, world: Path) -> None:
    code = "import os; print(os.readlink('/proc/self/ns/net'))"
    out = _run(unshare_ex, make_profile(world, NetworkMode.ON), code)
    assert str(out["stdout"]).strip() == os.readlink("/proc/self/ns/net")
    assert "net" not in out["isolation"]["namespaces"]  # type: ignore[index]


def test_a_double_forked_child_that_leaves_the_process_group_dies_at_the_timeout(
        world: Path) -> None:
    """Layer: the pid namespace (`--kill-child`: its pid 1 dies, the kernel kills the rest).
    Without cgroups (proc option `cgroups: false`) the engine's process-group kill misses a
    grandchild that moved to its own group (setsid is refused; setpgid is not)."""
    tag = uuid.uuid4().hex
    ex = ProcExecutor("unshare", ProcOptions(cgroups=False, prespawn=0))
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
    try:
        with pytest.raises(PolicyEngineError) as exc:
            _run(ex, make_profile(world), code, timeout=2)
        assert exc.value.code == ErrorCode.TIMEOUT
    finally:
        ex.close()
    time.sleep(1.0)
    left = [pid for pid in filter(str.isdigit, os.listdir("/proc"))
            if f"orphan-{tag}".encode() in _cmdline(pid)]
    for pid in left:
        os.kill(int(pid), 9)
    assert left == [], "a grandchild outlived the call's timeout"


@pytest.mark.parametrize("launcher", ["native", "python"])
def test_a_tool_killed_by_a_signal_reports_128_plus_it(world: Path, launcher: str) -> None:
    """The tool is not the namespace's pid 1 (which ignores signals it has no handler for, even
    its own SIGKILL): the launcher stays as init, reaps, and passes the status on."""
    ex = ProcExecutor("unshare", ProcOptions(launcher=launcher))  # type: ignore[arg-type]
    if launcher == "python":  # no id-mapped bind: a root-owned tree is refused in strict mode
        os.chown(world / "out", 65533, 65533)
    try:
        killed = _run(ex, make_profile(world), "import os; os.kill(os.getpid(), 9); print('on')")
        termed = _run(ex, make_profile(world), "import os; os.kill(os.getpid(), 15)")
        failed = _run(ex, make_profile(world), "raise SystemExit(3)")
    finally:
        ex.close()
    assert killed["exit_code"] == 128 + 9, killed
    assert "on" not in str(killed["stdout"])
    assert termed["exit_code"] == 128 + 15
    assert failed["exit_code"] == 3


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def test_available_names_the_reason_and_calls_are_refused(world: Path) -> None:
    ex = ProcExecutor("unshare", ProcOptions(unshare="/nonexistent/unshare"))
    try:
        why = ex.available()
        assert isinstance(why, str)
        assert "/nonexistent/unshare" in why
        assert "util-linux" in why
        with pytest.raises(PolicyEngineError) as exc:
            _run(ex, make_profile(world), "print('ran')")
        assert exc.value.code == ErrorCode.PROVIDER_UNAVAILABLE
    finally:
        ex.close()


def test_a_sandbox_that_never_started_is_a_failure_not_a_result(
        unshare_ex: ProcExecutor, world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host launcher (no status pipe of its own) or `unshare` failing before the inner
    launcher reported: no tool ran, so no exit code is reported as the tool's."""
    ctx = ExecContext(profile=make_profile(world), deadline=time.monotonic() + 30)
    # a missing cwd is refused before anything starts, in the unshare view (issue 26)
    with pytest.raises(PolicyEngineError) as exc:
        unshare_ex.execute(ctx, ProcExecOp(tool="/bin/true", cwd=str(world / "missing")))
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED
    assert "does not exist (unshare view)" in exc.value.reason
    # one removed between that check and the start (the race, simulated by skipping the
    # check): `unshare --wd` fails before the inner launcher reports
    monkeypatch.setattr("plugins.executor_proc.executor.cwd_fact_refusal",
                        lambda *_: None)
    with pytest.raises(PolicyEngineError) as exc:
        unshare_ex.execute(ctx, ProcExecOp(tool="/bin/true", cwd=str(world / "missing")))
    assert exc.value.code == ErrorCode.EXECUTION_FAILED
    assert "could not set up the sandbox" in exc.value.reason


def test_restricted_network_is_refused_not_widened(unshare_ex: ProcExecutor,
                                                   world: Path) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        _run(unshare_ex, make_profile(world, NetworkMode.RESTRICTED), "print('ran')")
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED


def test_conformance_kit_claims_hold_in_compat_and_strict_refuses() -> None:
    """Every claim proc-unshare declares holds under the kit's attacks (network canary,
    confined writes, no set-id plant, not host root, no orphans, IPC isolation); it declares
    no bind mounts, so strict mode refuses it and compat mode records the degradation."""
    compat = {r.id: r for r in run_suite("proc-unshare", mode="compat").results}
    assert {cid: r.message for cid, r in compat.items() if r.status == "fail"} == {}
    for cid in ("claims.network-off", "claims.writes-confined", "claims.no-setid-plant",
                "claims.not-host-root", "claims.no-orphans", "claims.ipc-isolated",
                "compat.degraded-recorded"):
        assert compat[cid].status == "pass", (cid, compat[cid].message)
    strict = {r.id: r for r in run_suite("proc-unshare", mode="strict").results}
    assert strict["capabilities.runs[proc.exec]"].status == "fail"
    assert "lacks `bind_mounts`" in strict["capabilities.runs[proc.exec]"].message


def test_conformance_cli_for_proc_unshare() -> None:
    """`policy-engine conformance --executor proc-unshare --mode compat`: exit 0, every claim."""
    res = subprocess.run([sys.executable, "-m", "policy_engine.cli", "conformance", "--executor",
                          "proc-unshare", "--mode", "compat", "--format", "json"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    statuses = {r["id"]: r["status"] for r in report["checks"]}
    assert report["ok"] is True
    assert report["counts"]["fail"] == 0
    for cid in ("claims.network-off", "claims.writes-confined", "claims.no-setid-plant",
                "claims.not-host-root", "claims.no-orphans", "claims.ipc-isolated"):
        assert statuses[cid] == "pass", cid


CASE10_POLICY = """policy "seed003/case10" version "1.0.0"
defaults {
  timeout 20s
  network off
}
permit "read-ws" fs.read, fs.list paths ["@ROOT@/**"]
permit "py" proc.exec tool "python3"
require consent when `false`
"""


def _cli_run(tmp: Path, config: str, *argv: str) -> subprocess.CompletedProcess[str]:
    (tmp / "engine.yaml").write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--config", str(tmp / "engine.yaml"),
         "--policy", str(tmp / "p.sbpolicy"), "--manifest", str(tmp / "manifest.json"),
         "--grant", str(tmp / "grant.json"), "--", *argv],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp)


def test_seed003_case10_linux_unshare_fallback(tmp_path: Path) -> None:
    """Seed 003 case 10: bubblewrap unusable for real (the proc option `bwrap` names a missing
    binary): proc-bwrap answers PROVIDER.UNAVAILABLE with the reason and never moves to
    another backend by itself; configured with proc-unshare, the same command runs, and the
    evidence names the backend and records the degradation (no bind-mount view)."""
    root = tmp_path / "ws"
    root.mkdir()
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "fs.read", "paths": [f"{root}/**"]}]
    (tmp_path / "p.sbpolicy").write_text(CASE10_POLICY.replace("@ROOT@", str(root)))
    (tmp_path / "grant.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "rt", "call_id": "c-1",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 10}}))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "name": "rt", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Process", "Read"], "safety_class": "Medium"}))
    state = tmp_path / "state"
    no_bwrap = "options:\n  proc: {bwrap: /nonexistent/bwrap}\n"
    cmd = ("python3", "-c", "import os; print('ran-as', os.geteuid(), os.getpid())")

    refused = _cli_run(tmp_path, f"state_dir: {state}\nmode: compat\n{no_bwrap}", *cmd)
    assert refused.returncode != 0
    assert "PROVIDER.UNAVAILABLE" in refused.stdout, refused.stdout + refused.stderr
    assert "bwrap is not installed at `/nonexistent/bwrap`" in refused.stdout
    assert "ran-as" not in refused.stdout
    assert "proc-unshare" not in refused.stdout

    ran = _cli_run(tmp_path, f"state_dir: {state}\nmode: compat\nbackends:\n"
                   f"  proc.exec: proc-unshare\n{no_bwrap}", *cmd)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "ran-as 65533 2" in ran.stdout  # the sandbox uid, in its own pid namespace
    assert "backend proc-unshare" in ran.stdout

    ends = [json.loads(line) for line in
            (state / "evidence" / "evidence.jsonl").read_text().splitlines()]
    ends = [e for e in ends if e.get("type") == "end"]
    assert ends[0]["status"] != "ok"
    assert ends[0]["sandbox_backend"] == "proc-bwrap"
    assert ends[0]["error_code"] == "PROVIDER.UNAVAILABLE"
    last = ends[-1]
    assert last["status"] == "ok"
    assert last["sandbox_backend"] == "proc-unshare"
    assert last["sandbox_degraded"] is True
    assert "lacks `bind_mounts`" in last["sandbox_degrade_reason"]

    strict = _cli_run(tmp_path, f"state_dir: {state}\nmode: strict\nbackends:\n"
                      f"  proc.exec: proc-unshare\n{no_bwrap}", *cmd)
    assert "SANDBOX.CAPABILITY_BLOCKED" in strict.stdout
    assert "ran-as" not in strict.stdout


EVIL = """
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/uid-%d", getenv("PE_MARK_DIR"), (int)geteuid());
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
}
"""


@pytest.mark.parametrize("prespawn", [0, 2])
def test_an_allowed_ld_preload_never_runs_as_host_root(prespawn: int) -> None:
    """Found attacking proc-unshare: `unshare` runs as root (it creates the namespaces, then
    drops) and is dynamically linked; handed the tool's environment, an `LD_PRELOAD` a policy
    allows (env_allow) ran its constructor as host uid 0. The environment now crosses in
    `env -i` after the drop; the tool still gets it."""
    where = Path(tempfile.mkdtemp(prefix="pe-preload-", dir="/var/tmp"))
    try:
        where.chmod(0o777)
        (where / "evil.c").write_text(EVIL)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(where / "evil.so"),
                        str(where / "evil.c")], check=True, timeout=60)
        (where / "evil.so").chmod(0o755)
        ex = ProcExecutor("unshare", ProcOptions(prespawn=prespawn,
                                                 env_allow=("LD_PRELOAD", "PE_MARK_DIR")))
        root = where / "ws"
        (root / "out").mkdir(parents=True)
        root.chmod(0o755)
        env = {"LD_PRELOAD": str(where / "evil.so"), "PE_MARK_DIR": str(where)}
        try:
            ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 30)
            out = ex.execute(ctx, ProcExecOp(tool=PYTHON, args=(
                "-c", "import os; print(os.environ.get('LD_PRELOAD'))"), env=env)).out
        finally:
            ex.close()
        assert str(out["stdout"]).strip() == env["LD_PRELOAD"], out  # the tool got it
        assert not (where / "uid-0").exists(), "code from LD_PRELOAD ran as host root"
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("backend", ["landlock", "unshare"])
def test_an_argument_shaped_like_a_variable_never_enters_the_environment(
        backend: str, world: Path) -> None:
    """Found while attacking proc-unshare: a held native launcher (the default, `prespawn` >
    0) put its own options and the tool's argv after the environment it was sent, so an
    argument `LD_PRELOAD=…` became the tool's LD_PRELOAD, past every env allow-list."""
    ex = ProcExecutor(backend)  # type: ignore[arg-type]
    code = "import json, os; print(json.dumps(sorted(os.environ)))"
    try:
        out = _run(ex, make_profile(world), code, "LD_PRELOAD=/nonexistent/x.so", "PE_INJECTED=1")
    finally:
        ex.close()
    keys = json.loads(str(out["stdout"]))
    assert "LD_PRELOAD" not in keys, keys
    assert "PE_INJECTED" not in keys
    assert keys == sorted(["GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_PARAMETERS",
                           "HOME", "LANG", "PATH", "PE_ARTIFACTS_DIR", "TMPDIR", "TZ"])
