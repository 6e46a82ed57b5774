"""gVisor (runsc) for high isolation: a named profile requiring `isolation gvisor` runs in a real
runsc container here, is refused by every backend that cannot provide it (strict and compat), and
`explain --config` answers as the run does. Everything through the CLI and a real dockerd; the
runtime registration is the project's own script (scripts/lib/runsc.sh).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from plugins.executor_docker import engine, runtimes
from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor, session_key
from policy_engine.executor import ExecContext
from policy_engine.model import Isolation, ProcExecOp
from tests.integration.test_docker_executor import make_profile

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GVISOR_KERNEL = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016"  # runsc's /proc/version
HOST_KERNEL = Path("/proc/version").read_text().strip()
HOST_RELEASE = os.uname().release

POLICY = """policy "t/gvisor" version "1.0.0"
defaults { timeout 60s  network off }
profile "high-isolation" {
  network off
  fs read-only
  isolation gvisor
  timeout 60s
  limits { memory 256MiB  pids 64  cpu 0.5 }
}
permit "py" proc.exec tool "python3"
require consent when `false`
"""

# what only gVisor's kernel shows, plus the hardening that must hold inside it
PROBE = textwrap.dedent("""
    import ctypes, errno, json, os, threading
    out = {"version": open("/proc/version").read().strip(), "uid": os.getuid(),
           "release": os.uname().release}
    st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    out["cap_eff"] = st["CapEff"].strip()
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(4096)  # syslog(2) READ_ALL: what dmesg prints
    n = libc.klogctl(3, buf, 4096)
    err = ctypes.get_errno()
    out["kmsg"] = buf.raw[:n].decode(errors="replace") if n > 0 else errno.errorcode[err]
    t = threading.Thread(target=lambda: out.__setitem__("thread", "ran")); t.start(); t.join()
    open("/workspace/work/f", "w").close()
    try:
        os.chmod("/workspace/work/f", 0o4755); out["chmod_setuid"] = "allowed"
    except OSError as e:
        out["chmod_setuid"] = errno.errorcode[e.errno]
    out["clone3"] = errno.errorcode[ctypes.get_errno()] if libc.syscall(435, 0, 0) else "ok"
    out["net"] = sorted(os.listdir("/sys/class/net"))
    print(json.dumps(out))
""")


def _files(tmp_path: Path, profile: str | None) -> tuple[Path, Path, Path]:
    (tmp_path / "p.sbpolicy").write_text(POLICY)
    perms = [{"kind": "proc.exec", "tool": "python3"}]
    (tmp_path / "grant.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:gv", "tool_name": "py", "call_id": "c-gv",
        "capabilities": perms, "expires_at": 4102444800000, "budget": {"calls": 10}}))
    manifest: dict[str, Any] = {"name": "py", "version": "1.0.0", "permissions": perms,
                                "side_effects": ["Process"], "safety_class": "Low"}
    if profile is not None:
        manifest["profile"] = profile
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "req.json").write_text(json.dumps({
        "op": {"kind": "proc.exec", "tool": "python3", "args": ["-c", "print(1)"]},
        "manifest": "manifest.json", "grant": "grant.json"}))
    return tmp_path / "p.sbpolicy", tmp_path / "manifest.json", tmp_path / "grant.json"


def _config(tmp_path: Path, body: str) -> Path:
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n{body}")
    return cfg


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                          capture_output=True, text=True, timeout=240, check=False,
                          cwd=tmp_path)


def _run(tmp_path: Path, cfg: Path, code: str) -> subprocess.CompletedProcess[str]:
    pol, man, gr = tmp_path / "p.sbpolicy", tmp_path / "manifest.json", tmp_path / "grant.json"
    return _cli(tmp_path, "run", "--config", str(cfg), "--policy", str(pol), "--manifest",
                str(man), "--grant", str(gr), "--format", "json", "--", "python3", "-c", code)


def _explain(tmp_path: Path, cfg: Path | None) -> subprocess.CompletedProcess[str]:
    config = ["--config", str(cfg)] if cfg is not None else []
    return _cli(tmp_path, "explain", *config, "--policy", str(tmp_path / "p.sbpolicy"),
                "--request", str(tmp_path / "req.json"), "--format", "json")


def test_the_project_script_registers_runsc_with_dockerd() -> None:
    script = ("source scripts/lib/dockerd.sh && ensure_dockerd && source scripts/lib/runsc.sh "
              "&& ensure_runsc")
    done = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "runsc registered with dockerd" in done.stdout
    client = docker.from_env()
    entry = runtimes.registered(client)["runsc"]
    client.close()
    assert entry["path"] == "/usr/bin/runsc"
    assert {"--platform=ptrace", "--network=none", "--oci-seccomp"} <= set(entry["runtimeArgs"])
    assert runtimes.is_gvisor(entry)
    # registered means usable: a plain `docker run --runtime=runsc` boots gVisor's kernel
    booted = subprocess.run(["docker", "run", "--rm", "--runtime=runsc", "--network=none",
                             "--security-opt", "seccomp=unconfined",  # let dmesg read
                             "-v", "/usr:/usr:ro", engine.DEFAULT_IMAGE, "dmesg"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert booted.returncode == 0, booted.stderr
    assert "Starting gVisor..." in booted.stdout


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_high_isolation_runs_in_a_gvisor_kernel(tmp_path: Path, mode: str) -> None:
    _files(tmp_path, "high-isolation")
    cfg = _config(tmp_path, "backends:\n  proc.exec: docker\noptions:\n  docker:\n"
                            f"    mode: {mode}\n    pool_size: 1\n    gvisor_runtime: runsc\n")
    ran = _run(tmp_path, cfg, PROBE)
    assert "Traceback" not in ran.stderr, ran.stderr
    out = json.loads(ran.stdout)
    assert out["result"]["ok"] is True, out["result"]
    seen = json.loads(out["result"]["out"]["stdout"])
    # gVisor's own kernel answered, not the host's
    assert seen["version"] == GVISOR_KERNEL != HOST_KERNEL
    assert seen["release"] == "4.4.0" != HOST_RELEASE
    assert seen["kmsg"] == "EPERM"  # syslog(2) is on the executor's deny list, in gVisor too
    assert (seen["uid"], seen["cap_eff"], seen["net"]) == (1000, "0000000000000000", ["lo"])
    # the executor's seccomp profile is applied inside the sandbox (runsc --oci-seccomp) and
    # threads still start (the ENOSYS rules are left out: gVisor answers ENOSYS itself)
    assert seen["chmod_setuid"] == "EPERM"
    assert seen["clone3"] == "ENOSYS"
    assert seen["thread"] == "ran"
    meta = json.loads((Path(out["result"]["out"]["artifacts_dir"]) / "meta.json").read_text())
    assert meta["policy_snapshot"]["container"]["runtime"] == "runsc"
    # explain with the same config agrees, and shows the requirement
    explained = json.loads(_explain(tmp_path, cfg).stdout)
    assert explained["decision"] == "allow"
    assert explained["profile"]["isolation"] == "gvisor"
    assert explained["trace"][-1]["node"] == "backend"
    assert "provides isolation `gvisor`" in explained["trace"][-1]["detail"]


def test_without_the_requirement_the_same_executor_uses_runc(tmp_path: Path) -> None:
    _files(tmp_path, None)
    cfg = _config(tmp_path, "backends:\n  proc.exec: docker\noptions:\n  docker:\n"
                            "    gvisor_runtime: runsc\n")
    out = json.loads(_run(tmp_path, cfg, "print(open('/proc/version').read().strip())").stdout)
    assert out["result"]["ok"] is True, out["result"]
    assert out["result"]["out"]["stdout"].strip() == HOST_KERNEL


@pytest.mark.parametrize("mode", ["strict", "compat"])
def test_a_backend_without_gvisor_is_refused_in_every_mode(tmp_path: Path, mode: str) -> None:
    _files(tmp_path, "high-isolation")
    for body in (f"mode: {mode}\n",  # the default proc backend (bubblewrap)
                 f"mode: {mode}\nbackends:\n  proc.exec: docker\n"):  # docker without runsc
        cfg = _config(tmp_path, body)
        ran = _run(tmp_path, cfg, "print('ran')")
        out = json.loads(ran.stdout)
        assert out["result"]["ok"] is False
        assert out["result"]["code"] == "SANDBOX.CAPABILITY_BLOCKED"
        assert "cannot provide `isolation:gvisor`" in out["result"]["message"]
        assert "never degrades" in out["result"]["message"]
        explained = json.loads(_explain(tmp_path, cfg).stdout)
        assert (explained["decision"], explained["code"]) == ("deny", out["result"]["code"])
        assert out["result"]["message"].endswith(explained["reason"])
    # without a config explain cannot know the backend: it shows what is required of it
    plain = json.loads(_explain(tmp_path, None).stdout)
    assert plain["decision"] == "allow"
    assert len(plain["backend_requires"]) == 1
    assert "isolation:gvisor" in plain["backend_requires"][0]


def test_an_unregistered_runtime_stops_the_engine_at_start(tmp_path: Path) -> None:
    _files(tmp_path, None)
    cfg = _config(tmp_path, "backends:\n  proc.exec: docker\noptions:\n  docker:\n"
                            "    runtime: kata-nope\n")
    ran = _run(tmp_path, cfg, "print('ran')")
    assert ran.returncode == 2
    assert "Traceback" not in ran.stderr
    assert "`runtime: kata-nope` is not a runtime registered with dockerd" in ran.stderr
    # dockerd's own list varies by version (io.containerd.* entries on newer ones): the
    # message names every registered runtime, among them the two the scripts ensure
    listed = re.search(r"\(registered: ([^)]*)\)", ran.stderr)
    assert listed is not None, ran.stderr
    assert {"`runc`", "`runsc`"} <= set(listed.group(1).split(", "))
    cfg = _config(tmp_path, "backends:\n  proc.exec: docker\noptions:\n  docker:\n"
                            "    gvisor_runtime: runc\n")
    ran = _run(tmp_path, cfg, "print('ran')")
    assert ran.returncode == 2
    assert "`gvisor_runtime: runc` is not gVisor" in ran.stderr


def test_dockerd_is_sent_the_runtime_the_profile_requires(tmp_path: Path) -> None:
    """What the executor hands dockerd, read back from dockerd: HostConfig.Runtime."""
    ex = DockerExecutor(DockerOptions(gvisor_runtime="runsc"), state_dir=tmp_path / "s")
    client, _ = ex.client()
    created = []
    try:
        for iso, want in ((Isolation.GVISOR, "runsc"), (None, "runc")):
            prof = make_profile(tmp_path).model_copy(update={"isolation": iso})
            runtime = runtimes.for_profile(prof, ex.runtimes)
            hard = engine.hardening(prof, ex.options, runtime=runtime,
                                    gvisor=runtime == ex.runtimes.gvisor)
            c = client.containers.create(ex.options.image, ["/usr/bin/true"],
                                         **hard.create_kwargs())
            created.append(c)
            assert client.api.inspect_container(c.id)["HostConfig"]["Runtime"] == want
    finally:
        for c in created:
            c.remove(force=True)
        ex.close()


def test_the_warm_pool_never_hands_a_runc_container_to_a_gvisor_call(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    ex = DockerExecutor(DockerOptions(mode="pool", pool_size=1, gvisor_runtime="runsc"),
                        state_dir=tmp_path_factory.mktemp("state"))
    code = ProcExecOp(tool="python3", args=("-c", "print(open('/proc/version').read())"))
    try:
        seen = {}
        for iso in (None, Isolation.GVISOR, None, Isolation.GVISOR):  # one session throughout
            prof = make_profile(tmp_path).model_copy(update={"isolation": iso,
                                                             "name": "high-isolation"})
            res = ex.execute(ExecContext(profile=prof, deadline=time.monotonic() + 90), code)
            seen.setdefault(iso, set()).add(res.out["stdout"].strip())
        assert seen == {None: {HOST_KERNEL}, Isolation.GVISOR: {GVISOR_KERNEL}}
        api = ex.client()[0].api
        for runtime, pool in ex._pools.items():
            for cid in pool.states():
                assert api.inspect_container(cid)["HostConfig"]["Runtime"] == (runtime or "runc")
        assert set(ex._pools) == {None, "runsc"}
        ex.end_session(make_profile(tmp_path))
        assert all(session_key(make_profile(tmp_path)) not in p._by_session
                   for p in ex._pools.values())
    finally:
        ex.close()


def test_the_seed_limits_hold_inside_gvisor(tmp_path_factory: pytest.TempPathFactory,
                                            tmp_path: Path) -> None:
    """high-isolation's pids 32 and memory 256MiB: runsc would not even start under a host pids
    limit of 32 (its own tasks count there), so pids is RLIMIT_NPROC inside gVisor."""
    ex = DockerExecutor(DockerOptions(gvisor_runtime="runsc"),
                        state_dir=tmp_path_factory.mktemp("state"))
    fork = ProcExecOp(tool="python3", args=("-c", textwrap.dedent("""
        import subprocess
        ps = []
        try:
            for _ in range(40):
                ps.append(subprocess.Popen(["/usr/bin/sleep", "5"]))
        except OSError as e:
            print("stopped at", len(ps), e.errno, flush=True)
        for p in ps:
            p.kill()
    """)))
    hog = ProcExecOp(tool="python3", args=("-c", "b = bytearray(400 << 20); print('kept')"))
    try:
        for _ in range(2):  # the cgroup backstop must not kill the sandbox near the limit
            prof = make_profile(tmp_path, pids=32, memory_bytes=256 << 20).model_copy(
                update={"isolation": Isolation.GVISOR, "name": "high-isolation"})
            res = ex.execute(ExecContext(profile=prof, deadline=time.monotonic() + 90), fork)
            assert res.out["stdout"] == "stopped at 31 11\n"  # EAGAIN, python itself is one
            assert res.out["exit_code"] == 0
        res = ex.execute(ExecContext(profile=prof, deadline=time.monotonic() + 90), hog)
        assert res.out["exit_code"] == 137  # killed by the memory cgroup
        assert "kept" not in res.out["stdout"]
    finally:
        ex.close()


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_restricted_network_reaches_the_policy_proxy_from_gvisor(tmp_path: Path,
                                                                 mode: str) -> None:
    """The proxy and the in-container bridge meet on a host Unix socket: runsc's
    `--host-uds=open` lets exactly that through; nothing else is reachable."""
    from tests.integration.servers import LoopbackServer
    from tests.integration.test_docker_network import CLIENT, ROUTES, policy

    ex = DockerExecutor(DockerOptions(mode=mode, pool_size=1, gvisor_runtime="runsc",
                                      workspace_root=str(tmp_path / "ws")))
    try:
        with LoopbackServer(ROUTES) as server:
            profile, guard = policy(tmp_path, server.port)
            profile = profile.model_copy(update={"isolation": Isolation.GVISOR})
            ctx = ExecContext(profile=profile, deadline=time.monotonic() + 120, guard=guard)
            op = ProcExecOp(tool="python3", args=(
                "-c", CLIENT + "\nprint(open('/proc/version').read().strip())",
                server.url("/ok/page"), server.url("/nope"),
                f"http://127.0.0.2:{server.port}/ok/page", "127.0.0.1", str(server.port)))
            res = ex.execute(ctx, op)
            assert res.out["exit_code"] == 0, res.out["stderr"]
            seen_line, version = res.out["stdout"].strip().split("\n")
            seen = json.loads(seen_line)
            assert version == GVISOR_KERNEL
            assert seen["ok"] == [200, "through the proxy"]
            assert seen["nope"][0] == 403
            assert seen["other"][0] == 403
            assert seen["direct_loopback"] == "ConnectionRefusedError"
            assert seen["direct_public"] in ("OSError", "TimeoutError")
            assert [p for _m, p, _h in server.seen.requests] == ["/ok/page"]
    finally:
        ex.close()
