"""A permit rule's `limits` are what the sandbox runs under (issue 10 item 1), measured from inside
each real executor through the orchestrator: the rule is narrower than the policy defaults and
the request states no value, so only the rule can be the source of the limit that bites.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.model import (
    BrowserNavOp,
    FsListOp,
    FsReadOp,
    Grant,
    Manifest,
    NetHttpOp,
    OpKind,
    ProcExecOp,
    Settings,
)
from policy_engine.orchestrator import Orchestrator, RunOutcome
from tests.integration.servers import LoopbackServer, send

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

POLICY = """policy "t/rule-limits" version "1.0.0"
defaults {{
  timeout 20s
  network {network}
  limits {{ bytes_in 10MiB  bytes_out 1MiB  files 100  depth 3 }}
}}
permit "small-read" fs.read paths ["{root}/small/**"] limits {{ bytes_in 16B }}
permit "small-list" fs.list paths ["{root}/small"] limits {{ files 1  depth 1 }}
permit "read" fs.read, fs.list paths ["{root}/**", "{root}"]
permit "py" proc.exec tool "python3"
  limits {{ cpu 1  memory 256MiB  pids 12  timeout 10s  stdout 64KiB }}
permit "sleep" proc.exec tool "sleep" limits {{ timeout 1s }}
permit "web" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{port}]
  limits {{ bytes_in 16B }}
permit "browse" browser.use hosts ["127.0.0.1"] schemes ["http"] ports [{port}]
  limits {{ bytes_in 16B }}
"""

def caps(port: int) -> list[dict[str, Any]]:
    web = {"hosts": ["127.0.0.1"], "schemes": ["http"], "ports": [port]}
    return [
        {"kind": "fs.read", "paths": ["/**"]}, {"kind": "fs.list", "paths": ["/**"]},
        {"kind": "proc.exec", "tool": "python3"}, {"kind": "proc.exec", "tool": "sleep"},
        {"kind": "net.http", **web}, {"kind": "browser.use", **web},
    ]


class Env:
    """One policy, grant and manifest rooted at a temporary workspace, run by an orchestrator."""

    def __init__(self, tmp: Path, network: str = "off",
                 backends: dict[OpKind, str] | None = None,
                 options: dict[str, dict[str, Any]] | None = None, compat: bool = False,
                 port: int = 80) -> None:
        self.root = tmp / "ws"
        (self.root / "small").mkdir(parents=True)
        (self.root / "small" / "big.txt").write_bytes(b"S" * 999 + b"\n")
        for name in "abc":
            (self.root / "small" / name).write_text(name)
        policy = tmp / "p.sbpolicy"
        policy.write_text(POLICY.format(root=self.root, network=network, port=port))
        self.grant = Grant.model_validate({
            "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
            "capabilities": caps(port), "expires_at": 4_102_444_800_000, "budget": {"calls": 100},
            "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4_102_444_800_000}})
        self.manifest = Manifest.model_validate({
            "name": "tool", "version": "1.0.0", "permissions": caps(port),
            "side_effects": ["Process", "Read"], "safety_class": "Low",
            **({"network": network} if network != "off" else {})})
        self.settings = Settings(root_fs=str(self.root))
        self.config = EngineConfig(state_dir=tmp / "state", revocation="memory",
                                   backends=backends or {}, options=options or {},
                                   mode="compat" if compat else "strict")
        self.orch = Orchestrator(compile_files([policy]), config=self.config)

    def run(self, op: Any) -> RunOutcome:
        return self.orch.run(self.grant, self.manifest, op, settings=self.settings)

    def close(self) -> None:
        self.orch.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.close()


@pytest.fixture(params=["proc-bwrap", "proc-landlock"])
def proc_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    # Landlock has no bind mounts: it runs in compat mode (degraded), as operators run it
    e = Env(tmp_path, backends={OpKind.PROC_EXEC: request.param},
            compat=request.param == "proc-landlock")
    yield e
    e.close()


ALLOC = ("import sys\ntry:\n    b = bytearray(600 * 1024 * 1024)\n"
         "    b[::4096] = b'x' * len(b[::4096])\n"
         "    print('allocated', len(b))\nexcept MemoryError:\n    print('MemoryError')\n")
SPAWN = ("import subprocess\nps = []\ntry:\n    for _ in range(40):\n"
         "        ps.append(subprocess.Popen(['sleep', '3']))\n    print('spawned', len(ps))\n"
         "except OSError as e:\n    print('refused after', len(ps), e.errno)\n"
         "for p in ps:\n    p.kill()\n")


def test_rule_timeout_kills_sleep(proc_env: Env) -> None:
    started = time.monotonic()
    out = proc_env.run(ProcExecOp(tool="sleep", args=("3",)))
    elapsed = time.monotonic() - started
    assert out.decision.allowed
    assert out.result.code == "LLM.TIMEOUT", out.result
    assert elapsed < 2.8, elapsed
    assert out.decision.limits is not None
    assert out.decision.limits.timeout_ms == 1000
    assert out.decision.limit_layers is not None
    assert out.decision.limit_layers["timeout_ms"] == "rule"


def test_rule_memory_fails_a_600_mb_allocation(proc_env: Env) -> None:
    out = proc_env.run(ProcExecOp(tool="python3", args=("-c", ALLOC)))
    assert out.decision.allowed
    stdout = out.result.out.get("stdout", "") if out.result.ok else ""
    assert "allocated" not in stdout, out.result
    if out.result.ok:  # MemoryError (rlimit) or killed: either way not allocated
        assert "MemoryError" in stdout or out.result.out["exit_code"] != 0
        assert "268435456" in json.dumps(out.result.out["limits"])
    else:  # the cgroup's OOM killer: a limit hit naming the rule's limit (attack round 4 F04)
        assert out.result.code == "QUOTA.BUDGET_EXCEEDED", out.result
        assert "268435456" in str(out.result.message)


def test_rule_pids_refuses_a_fork_bomb(proc_env: Env) -> None:
    out = proc_env.run(ProcExecOp(tool="python3", args=("-c", SPAWN)))
    assert out.result.ok, out.result
    assert "refused after" in out.result.out["stdout"], out.result.out
    count = int(out.result.out["stdout"].split()[2])
    assert count < 12
    assert "12" in out.result.out["limits"]["pids"]


def test_rule_stdout_keeps_64_kib(proc_env: Env) -> None:
    out = proc_env.run(ProcExecOp(tool="python3", args=(
        "-c", "import sys; sys.stdout.write('x' * 200_000)")))
    assert out.result.ok, out.result
    assert out.result.out["stdout_truncated"] is True
    assert len(out.result.out["stdout"]) <= 64 * 1024
    assert out.decision.limit_layers is not None
    assert out.decision.limit_layers["max_stdout_bytes"] == "rule"


def test_rule_bytes_in_refuses_a_1000_byte_read(env: Env) -> None:
    small = env.run(FsReadOp(path=str(env.root / "small" / "big.txt")))
    # the guard sees the size as the executor would, so the decision already refuses it
    # (dry run equals run) and names the rule whose limit bites
    assert small.decision.code == "SANDBOX.CAPABILITY_BLOCKED", small.decision
    assert small.decision.rule is not None
    assert small.decision.rule.id == "small-read"
    assert small.result.code == "SANDBOX.CAPABILITY_BLOCKED", small.result
    assert "max_bytes_in 16 (set by rule)" in (small.result.message or "")
    # the same content outside small/ is permitted by the broad rule: read whole
    (env.root / "big.txt").write_bytes(b"S" * 1000)
    assert env.run(FsReadOp(path=str(env.root / "big.txt"))).result.out["size"] == 1000


def test_rule_files_limits_a_listing(env: Env) -> None:
    out = env.run(FsListOp(path=str(env.root / "small"), depth=1))
    assert out.result.ok, out.result
    assert out.result.out["count"] == 1
    assert out.result.out["truncated"] is True
    # the broad rule (policy defaults: files 100, depth 3) lists the same entries and more
    wide = env.run(FsListOp(path=str(env.root), depth=2))
    assert wide.result.out["count"] == 5, wide.result.out
    assert wide.result.out["truncated"] is False


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    body = b"<html><body>" + b"x" * 1000 + b"</body></html>"
    with LoopbackServer({"/big": lambda h: send(h, 200, "text/html", body)}) as srv:
        yield srv


def test_rule_bytes_in_limits_an_http_response(tmp_path: Path, server: LoopbackServer) -> None:
    e = Env(tmp_path, network="on", port=server.port)
    try:
        out = e.run(NetHttpOp(url=server.url("/big")))
    finally:
        e.close()
    assert out.decision.allowed
    assert out.decision.limits is not None
    assert out.decision.limits.max_bytes_in == 16
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED", out.result
    assert "16" in (out.result.message or "")


def test_rule_bytes_in_limits_a_browser_page(tmp_path: Path, server: LoopbackServer) -> None:
    e = Env(tmp_path, network="on", port=server.port)
    try:
        out = e.run(BrowserNavOp(url=server.url("/big")))
    finally:
        e.close()
    assert out.decision.allowed
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED", out.result
    assert "16-byte limit" in (out.result.message or "")


def test_git_readonly_rule_limits_appear_in_the_launch(tmp_path: Path) -> None:
    """The example org policy through the CLI: `git-readonly` says 512MiB / 64 pids / 30s."""
    ex = ROOT / "examples"
    done = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "run", "--policy",
         str(ex / "policies" / "org.sbpolicy"), "--manifest", str(ex / "manifests" / "shell.json"),
         "--grant", str(ex / "grants" / "shell-agent.json"), "--state-dir",
         str(tmp_path / "state"), "--format", "json", "--", "git", "status"],
        capture_output=True, text=True, timeout=120, check=False)
    data = json.loads(done.stdout)
    launch = data["result"]["out"]["limits"]
    assert "memory=536870912" in launch["memory"], launch
    assert "pids.max=64" in launch["pids"], launch
    assert launch["wall"].startswith("30.0s"), launch
    layers = data["decision"]["limit_layers"]
    assert layers["memory_bytes"] == layers["pids"] == layers["timeout_ms"] == "rule"
    assert layers["max_stdout_bytes"] == "manifest"


DOCKER_POLICY = """policy "t/docker-limits" version "1.0.0"
defaults { timeout 30s  network off }
permit "py" proc.exec tool "python3" limits { memory 256MiB  pids 16  timeout 4s }
permit "w" fs.write paths ["/workspace/work/**"]
"""


def test_docker_runs_under_the_rule_limits(tmp_path: Path) -> None:
    (tmp_path / "p.sbpolicy").write_text(DOCKER_POLICY)
    # an fs.write grant: docker has no read-only root file system to offer otherwise
    cap = [{"kind": "proc.exec", "tool": "python3"},
           {"kind": "fs.write", "paths": ["/workspace/work/**"]}]
    grant = Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
        "capabilities": cap, "expires_at": 4_102_444_800_000,
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4_102_444_800_000}})
    manifest = Manifest.model_validate({"name": "tool", "version": "1", "permissions": cap,
                                        "side_effects": ["Process"], "safety_class": "Low"})
    (tmp_path / "ws").mkdir()
    config = EngineConfig(state_dir=tmp_path / "state", revocation="memory",
                          backends={OpKind.PROC_EXEC: "docker"})
    settings = Settings(root_fs=str(tmp_path / "ws"))
    with Orchestrator(compile_files([tmp_path / "p.sbpolicy"]), config=config) as orch:
        alloc = orch.run(grant, manifest, ProcExecOp(tool="python3", args=("-c", ALLOC)),
                         settings=settings)
        started = time.monotonic()
        slow = orch.run(grant, manifest, ProcExecOp(
            tool="python3", args=("-c", "import time; time.sleep(8); print('done')")),
            settings=settings)
        elapsed = time.monotonic() - started
    assert alloc.end.sandbox_backend == "docker"
    stdout = alloc.result.out.get("stdout", "") if alloc.result.ok else ""
    assert "allocated" not in stdout, alloc.result
    assert slow.result.code == "LLM.TIMEOUT", slow.result
    assert elapsed < 7.5, elapsed


def test_fs_write_rule_bytes_out(tmp_path: Path) -> None:
    """A write the rule's bytes_out refuses never reaches the disk."""
    policy = tmp_path / "w.sbpolicy"
    root = tmp_path / "ws"
    root.mkdir()
    policy.write_text('policy "t/w" version "1.0.0"\n'
                      f'permit "w" fs.write paths ["{root}/**"] limits {{ bytes_out 8B }}\n')
    cap = [{"kind": "fs.write", "paths": ["/**"]}]
    grant = Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
        "capabilities": cap, "expires_at": 4_102_444_800_000,
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4_102_444_800_000}})
    manifest = Manifest.model_validate({"name": "tool", "version": "1", "permissions": cap,
                                        "side_effects": ["Write"], "safety_class": "Low"})
    config = EngineConfig(state_dir=tmp_path / "state", revocation="memory")
    from policy_engine.model import FsWriteOp
    with Orchestrator(compile_files([policy]), config=config) as orch:
        out = orch.run(grant, manifest, FsWriteOp(
            path=str(root / "f"), bytes_b64=base64.b64encode(b"0123456789").decode()),
            settings=Settings(root_fs=str(root)))
    assert out.result.code == "SANDBOX.CAPABILITY_BLOCKED", out.result
    assert "(set by rule)" in out.result.message or "8" in (out.result.message or "")
    assert not (root / "f").exists()


def test_proxied_responses_are_cut_at_the_proc_rules_bytes_in(
        tmp_path: Path, server: LoopbackServer) -> None:
    """Network `restricted`: the policy proxy cuts what flows into the sandbox at the call's
    `bytes_in` (the proc.exec rule's 512B), though the net.http rule itself sets none; the
    response's status line and headers count too, so less than 512B of the body arrives."""
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(
        'policy "t/proxy-limits" version "1.0.0"\ndefaults { network restricted }\n'
        f'permit "web" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{server.port}]\n'
        'permit "curl" proc.exec tool "curl" limits { bytes_in 512B }\n')
    caps: list[dict[str, Any]] = [
        {"kind": "net.http", "hosts": ["127.0.0.1"], "schemes": ["http"],
         "ports": [server.port]}, {"kind": "proc.exec", "tool": "curl"}]
    grant = Grant.model_validate({
        "tenant": "t", "subject_id": "agent:a", "tool_name": "tool", "call_id": "c1",
        "capabilities": caps, "expires_at": 4_102_444_800_000,
        "consent": {"granted_by": "user:u", "granted_at": 1, "expires_at": 4_102_444_800_000}})
    manifest = Manifest.model_validate({
        "name": "tool", "version": "1", "permissions": caps, "network": "restricted",
        "side_effects": ["Process", "Network"], "safety_class": "Low"})
    config = EngineConfig(state_dir=tmp_path / "state", revocation="memory")
    with Orchestrator(compile_files([policy]), config=config) as orch:
        out = orch.run(grant, manifest, ProcExecOp(tool="curl", args=(
            "-s", "--max-time", "20", "-o", "/dev/null", "-w", "%{size_download}",
            server.url("/big"))))
    assert out.result.ok, out.result
    assert 0 < int(out.result.out["stdout"]) < 512, out.result.out
    assert out.result.used.bytes_in == 512  # head and body, cut at the limit exactly
