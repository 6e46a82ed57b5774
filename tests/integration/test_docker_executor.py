"""The `docker` executor against the real Docker Engine (run-once mode) and its failure codes."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_docker import engine
from plugins.executor_docker.engine import DockerOptions
from plugins.executor_docker.executor import DockerExecutor
from plugins.executor_docker.plugin import policy_engine_executors
from plugins.executor_docker.workspace import check_mounts, prepare, project_id_of
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext, Executor
from policy_engine.model import (
    AllowLists,
    Budget,
    DenyLists,
    Limits,
    Mappings,
    NetworkMode,
    ProcExecOp,
    Profile,
    SafetyClass,
    SideEffect,
)

pytestmark = pytest.mark.integration


def make_profile(root: Path, network: NetworkMode = NetworkMode.OFF, **limits: Any) -> Profile:
    return Profile(
        tenant="t", subject_id="agent:d", tool_name="py", call_id="call-1",
        safety=SafetyClass.LOW, side_effects=(SideEffect.PROCESS,), limits=Limits(**limits),
        budget=Budget(), allow=AllowLists(), deny=DenyLists(),
        mappings=Mappings(root_fs=str(root)), network=network, timeout_ms=60_000,
        consent_required=False, expires_at=0, policy_name="p", policy_version="1",
        policy_version_hash="h", manifest_version="1", profile_hash="ph-123",
    )


def ctx_for(root: Path, seconds: float = 90, **limits: Any) -> ExecContext:
    return ExecContext(profile=make_profile(root, **limits), deadline=time.monotonic() + seconds)


def py(code: str, **kw: Any) -> ProcExecOp:
    return ProcExecOp(tool="python3", args=("-c", code), **kw)


@pytest.fixture(scope="module")
def docker_ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerExecutor]:
    ex = DockerExecutor(DockerOptions(max_artifacts_bytes=1536 * 1024),
                        state_dir=tmp_path_factory.mktemp("state"))
    yield ex
    ex.close()


def test_plugin_hook_validates_options() -> None:
    [ex] = policy_engine_executors(EngineConfig())
    assert isinstance(ex, Executor)
    assert ex.name == "docker"
    with pytest.raises(ValueError, match="mode"):
        policy_engine_executors(EngineConfig(options={"docker": {"mode": "fast"}}))


HARDENING_PROBE = """
import os, json
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
def read(p):
    try: return open(p).read().strip()
    except OSError as e: return 'missing'
print(json.dumps({
  'uid': os.getuid(), 'gid': os.getgid(), 'cwd': os.getcwd(),
  'cap_eff': status['CapEff'].strip(), 'nnp': status['NoNewPrivs'].strip(),
  'net': sorted(os.listdir('/sys/class/net')),
  'pids_max': read('/sys/fs/cgroup/pids/pids.max'),
  'mem_max': read('/sys/fs/cgroup/memory/memory.limit_in_bytes'),
  'cfs': read('/sys/fs/cgroup/cpu/cpu.cfs_quota_us'),
  'workspace': sorted(os.listdir('/workspace')),
}))
"""


def test_container_has_the_seed_002_hardening(docker_ex: DockerExecutor, tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, pids=64, memory_bytes=256 * 1024 * 1024, cpu_cores=0.5)
    res = docker_ex.execute(ctx, py(HARDENING_PROBE))
    assert res.out["exit_code"] == 0, res.out["stderr"]
    probe = json.loads(res.out["stdout"])
    assert (probe["uid"], probe["gid"], probe["cwd"]) == (1000, 1000, "/workspace/work")
    assert probe["cap_eff"] == "0000000000000000"
    assert probe["nnp"] == "1"
    assert probe["net"] == ["lo"]
    assert probe["pids_max"] == "64"
    assert probe["mem_max"] == str(256 * 1024 * 1024)
    assert probe["cfs"] == "50000"
    assert probe["workspace"] == ["artifacts", "inputs", "work"]


def test_a_tiny_cpu_limit_is_never_no_limit(docker_ex: DockerExecutor, tmp_path: Path) -> None:
    """Docker reads ``NanoCpus: 0`` as "no limit": ``cpu_cores`` 1e-10 became ``int(0.1) == 0``
    and the container ran with ``cfs_quota_us -1`` (a request that may only narrow a limit
    lifted it). ``Limits`` now refuses less than 0.01 cores; the executor, as a second line,
    still gives a profile built without validation the smallest quota Docker accepts (what
    dockerd stored for a container created with the call's settings)."""
    with pytest.raises(ValueError, match="0.01"):
        Limits(cpu_cores=1e-10)
    profile = make_profile(tmp_path).model_copy(
        update={"limits": Limits.model_construct(cpu_cores=1e-10)})
    hard = engine.hardening(profile, docker_ex.options).on_host_of(docker_ex.daemon_cpus)
    client, _ = docker_ex.client()
    made = client.containers.create(docker_ex.options.image, ["true"],
                                    **{**hard.create_kwargs(), "network_mode": "none"})
    try:
        assert made.attrs["HostConfig"]["NanoCpus"] == 10_000_000
        made.reload()
        assert made.attrs["HostConfig"]["NanoCpus"] == 10_000_000
    finally:
        made.remove(force=True)


def test_a_call_too_slow_to_start_ends_at_its_deadline(docker_ex: DockerExecutor,
                                                        tmp_path: Path) -> None:
    """At a hundredth of a core runc's own start-up in the container's cgroup takes minutes:
    the call waited in ``container.start()`` on the engine's 10 s client timeout and failed as
    ``PROVIDER.UNAVAILABLE: docker engine did not answer in time``. The call's own deadline
    bounds its start: it ends as a timeout, at that deadline."""
    start = time.monotonic()
    # a second of CPU: past the deadline at a hundredth of a core even when the start is quick
    with pytest.raises(PolicyEngineError) as exc:
        docker_ex.execute(ctx_for(tmp_path, cpu_cores=0.01),
                          py("sum(range(30_000_000))", timeout_ms=3000))
    took = time.monotonic() - start
    assert exc.value.code is ErrorCode.TIMEOUT, exc.value  # was PROVIDER.UNAVAILABLE after 20 s
    assert took < 15, took


def test_a_cpu_limit_above_the_machine_is_the_machine(docker_ex: DockerExecutor,
                                                      tmp_path: Path) -> None:
    """dockerd refuses ``NanoCpus`` above its CPU count ("Range of CPUs is from 0.01 to 2.00"):
    a policy saying ``cpu 4`` made every docker call on a 2-core host fail with
    ``TOOL.EXECUTION_FAILED``. More cores than the host has limits nothing; the call runs with
    all of them."""
    ncpu = int(docker_ex.client()[0].info()["NCPU"])
    res = docker_ex.execute(ctx_for(tmp_path, cpu_cores=ncpu + 2.0), py(HARDENING_PROBE))
    assert res.out["exit_code"] == 0, res.out["stderr"]
    assert json.loads(res.out["stdout"])["cfs"] == str(ncpu * 100_000)


def test_workspace_mounts_and_per_exec_record(docker_ex: DockerExecutor, tmp_path: Path) -> None:
    project = docker_ex.state_dir / "docker" / "projects" / project_id_of(make_profile(tmp_path))
    (project / "inputs").mkdir(parents=True, exist_ok=True)
    (project / "inputs" / "data.txt").write_text("input data")
    code = (
        "import os\n"
        "print(open('/workspace/inputs/data.txt').read())\n"
        "try:\n open('/workspace/inputs/x', 'w')\nexcept OSError as e: print('ro', e.errno)\n"
        "open('/workspace/work/state.txt', 'w').write('kept')\n"
        "os.makedirs('/workspace/artifacts/sub')\n"
        "open('/workspace/artifacts/sub/out.bin', 'wb').write(b'abc')\n"
        "import sys; sys.stderr.write('warn\\n')\n"
    )
    res = docker_ex.execute(ctx_for(tmp_path), py(code))
    assert res.out["stdout"] == "input data\nro 30\n"
    assert res.out["stderr"] == "warn\n"
    assert (project / "work" / "state.txt").read_text() == "kept"
    art = Path(res.out["artifacts_dir"])
    assert art.parent == project / "artifacts"
    assert (art / "stdout.txt").read_text() == "input data\nro 30\n"
    assert (art / "stderr.txt").read_text() == "warn\n"
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["files"] == [{"path": "sub/out.bin", "size": 3, "sha256":
                                  "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}]
    meta = json.loads((art / "meta.json").read_text())
    assert meta["exit_code"] == 0
    assert meta["image"] == "policy-engine/sandbox:1"
    assert meta["policy_snapshot"]["profile_hash"] == "ph-123"
    assert meta["policy_snapshot"]["network"] == "off"
    assert meta["policy_snapshot"]["container"]["cap_drop"] == ["ALL"]
    targets = {m["target"]: (m["source"], m["read_only"]) for m in meta["mounts"]}
    assert targets["/workspace/inputs"] == (str(project / "inputs"), True)
    assert targets["/workspace/work"] == (str(project / "work"), False)
    assert targets["/workspace/artifacts"] == (str(art), False)
    assert targets["/usr"] == ("/usr", True)
    assert meta["duration_ms"] > 0


def test_output_is_truncated_head_and_tail_without_killing(docker_ex: DockerExecutor,
                                                          tmp_path: Path) -> None:
    code = ("import sys\nsys.stdout.write('HEAD' + 'x' * 300000)\nsys.stdout.flush()\n"
            "sys.stderr.write('e' * 5000)\nprint('TAIL')\nsys.exit(3)")
    res = docker_ex.execute(ctx_for(tmp_path, max_stdout_bytes=1000, max_stderr_bytes=100),
                            py(code))
    assert res.out["exit_code"] == 3
    assert res.out["stdout_truncated"] is True
    assert res.out["stderr_truncated"] is True
    assert res.out["stdout_bytes"] == 4 + 300000 + 5
    assert res.out["stdout"].startswith("HEAD")
    assert res.out["stdout"].endswith("TAIL\n")
    assert "bytes truncated" in res.out["stdout"]
    meta = json.loads((Path(res.out["artifacts_dir"]) / "meta.json").read_text())
    assert meta["stdout_truncated"] is True


def test_wall_timeout_kills_the_container(docker_ex: DockerExecutor, tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(PolicyEngineError) as exc:
        docker_ex.execute(ctx_for(tmp_path), py("import time; print('started', flush=True); "
                                                "time.sleep(60)", timeout_ms=2000))
    assert exc.value.code is ErrorCode.TIMEOUT
    assert time.monotonic() - start < 30
    art = Path(exc.value.audit["artifacts_dir"])
    meta = json.loads((art / "meta.json").read_text())
    assert meta["timed_out"] is True
    assert (art / "stdout.txt").read_text() == "started\n"
    client, _ = docker_ex.client()
    # this call's container: the one binding this test's directories (the daemon is shared with
    # other engines and test workers, whose containers run meanwhile)
    ours = (str(tmp_path), str(art))
    assert not [c.id for c in client.containers.list(
        all=True, filters={"ancestor": "policy-engine/sandbox:1", "status": "running"},
        ignore_removed=True)
        if any(str(m.get("Source", "")).startswith(ours) for m in c.attrs.get("Mounts", []))]


def test_artifacts_over_the_limit_are_removed(docker_ex: DockerExecutor, tmp_path: Path) -> None:
    code = ("for n in 'abc':\n"
            " open(f'/workspace/artifacts/{n}.bin', 'wb').write(b'z' * 1024 * 1024)")
    with pytest.raises(PolicyEngineError) as exc:
        docker_ex.execute(ctx_for(tmp_path), py(code))
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    art = Path(exc.value.audit["artifacts_dir"])
    assert sorted(p.name for p in art.iterdir()) == ["a.bin", "manifest.json", "meta.json",
                                                     "stderr.txt", "stdout.txt"]
    assert exc.value.audit["removed"] == ["b.bin", "c.bin"]


def test_refusals_before_anything_runs(docker_ex: DockerExecutor, tmp_path: Path) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        docker_ex.execute(ctx_for(tmp_path), py("print(1)", cwd="/etc"))
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    with pytest.raises(PolicyEngineError) as exc:
        docker_ex.execute(ctx_for(tmp_path), py("print(1)", cwd="../../etc"))
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    on = ExecContext(profile=make_profile(tmp_path, NetworkMode.ON),
                     deadline=time.monotonic() + 30)
    with pytest.raises(PolicyEngineError) as exc:
        docker_ex.execute(on, py("print(1)"))
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    assert exc.value.reason == "network `on` is not offered by the docker executor"
    # restricted is served by the proxy (test_docker_network.py) but needs the bridge's python
    no_usr = DockerExecutor(DockerOptions(system_binds=("/opt",), workspace_root=str(tmp_path)))
    restricted = ExecContext(profile=make_profile(tmp_path, NetworkMode.RESTRICTED),
                             deadline=time.monotonic() + 30)
    try:
        with pytest.raises(PolicyEngineError) as exc:
            no_usr.execute(restricted, py("print(1)"))
    finally:
        no_usr.close()
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    assert "/usr/bin/python3" in exc.value.reason


def test_mount_sources_are_only_the_three_template_paths(tmp_path: Path) -> None:
    ws = prepare(tmp_path, make_profile(tmp_path))
    with pytest.raises(PolicyEngineError) as exc:
        check_mounts(ws, [*ws.mounts(), (str(tmp_path), "/workspace/extra", True)])
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    with pytest.raises(PolicyEngineError):
        check_mounts(ws, [(str(ws.inputs), "/workspace/inputs", False)])  # inputs must be ro
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ws.work.rmdir()
    ws.work.symlink_to(elsewhere)
    with pytest.raises(PolicyEngineError) as exc:
        check_mounts(ws, ws.mounts())
    assert "symlink" in exc.value.reason


def test_unreachable_engine_fails_fast(tmp_path: Path) -> None:
    missing = DockerExecutor(DockerOptions(base_url=f"unix://{tmp_path}/none.sock"))
    dead_path = tmp_path / "dead.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(dead_path))  # bound but never listening: connections are refused
    stopped = DockerExecutor(DockerOptions(base_url=f"unix://{dead_path}", client_timeout_s=2))
    for ex in (missing, stopped):
        start = time.monotonic()
        with pytest.raises(PolicyEngineError) as exc:
            ex.execute(ctx_for(tmp_path), py("print(1)"))
        assert exc.value.code is ErrorCode.PROVIDER_UNAVAILABLE
        assert time.monotonic() - start < 5
    dead.close()


def test_missing_image_names_the_build_script(tmp_path: Path) -> None:
    ex = DockerExecutor(DockerOptions(image="policy-engine/not-built:0"))
    with pytest.raises(PolicyEngineError) as exc:
        ex.execute(ctx_for(tmp_path), py("print(1)"))
    assert exc.value.code is ErrorCode.PROVIDER_UNAVAILABLE
    assert "scripts/build-images.sh" in exc.value.reason
    ex.close()


def test_exec_record_survives_a_planted_symlink(docker_ex: DockerExecutor,
                                                tmp_path: Path) -> None:
    before = Path("/etc/hostname").read_bytes()
    code = "import os; os.symlink('/etc/hostname', '/workspace/artifacts/stdout.txt')"
    res = docker_ex.execute(ctx_for(tmp_path), py(code))
    art = Path(res.out["artifacts_dir"])
    assert not (art / "stdout.txt").is_symlink()
    assert Path("/etc/hostname").read_bytes() == before
