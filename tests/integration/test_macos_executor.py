"""`macos-sandbox-exec` on this Linux host: registered, honest, refused by name (seed 003 test 19),
and everything of its run path that can run here.

sandbox-exec itself cannot run on Linux. What runs for real: the CLI (`run`, `plugins`,
`conformance`) in subprocesses finding the executor through the entry point pyproject.toml
declares, the argv and environment it would start, and its spawn/wait/capture code driven
through a stand-in at the sandbox-exec path that drops ``-p PROFILE --`` and execs the tool
(it keeps the profile it was given, so the test checks that too). The stand-in confines
nothing: it tests our process handling, never the sandbox (docs/macos.md).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from plugins.executor_macos.executor import (
    NAME,
    SANDBOX_EXEC,
    MacosOptions,
    MacosSandboxExecutor,
    platform_reason,
)
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard.gitfiles import GIT_PINS
from policy_engine.model import Limits, NetworkMode, ProcCapability, ProcExecOp
from policy_engine.sandbox.sbpl import render_sbpl
from tests.unit.guard_fixtures import forbid, fs, make_profile, permit
from tests.unit.sbpl_eval import Access, decide, parse

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]
REASON = f"sandbox-exec is macOS-only; this host is {sys.platform}"


def entry_points_dir(root: Path) -> Path:
    """A dist-info carrying pyproject.toml's own entry for the executor (the installed
    metadata of this checkout may predate it), so child processes load it as pip would."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    target = project["project"]["entry-points"]["policy_engine.plugins"]["executor_macos"]
    info = root / "pe_macos_entry-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pe-macos-entry\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[policy_engine.plugins]\nexecutor_macos = {target}\n")
    return root


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "POLICY_ENGINE_STATE": str(tmp_path / "state"),
           "PYTHONPATH": os.pathsep.join([str(entry_points_dir(tmp_path / "ep")), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)


def test_seed003_case19_unsupported_platform_is_a_clear_error(tmp_path: Path) -> None:
    """Seed 003 test 19: on a platform sandbox-exec does not support, a call configured for it
    is refused with a clear error naming the platform, recorded, exit 1, no traceback."""
    (tmp_path / "engine.yaml").write_text("backends:\n  proc.exec: macos-sandbox-exec\n")
    proc = cli(tmp_path, "run", "--format", "json", "--config", "engine.yaml",
               "--policy", str(ROOT / "examples/policies/org.sbpolicy"),
               "--request", str(ROOT / "examples/requests/git-status.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    # the policy allows it, the platform cannot: the run reports the deny the dry run answers
    # with the same configuration (outsider round 4 F03)
    explained = cli(tmp_path, "explain", "--format", "json", "--config", "engine.yaml",
                    "--policy", str(ROOT / "examples/policies/org.sbpolicy"),
                    "--request", str(ROOT / "examples/requests/git-status.json"))
    said = json.loads(explained.stdout)
    assert (said["decision"], said["code"]) == ("deny", "PROVIDER.UNAVAILABLE"), said
    assert out["decision"]["decision"] == "deny"
    assert out["decision"]["code"] == said["code"]
    assert out["result"]["code"] == "PROVIDER.UNAVAILABLE"
    assert REASON in out["result"]["message"]
    assert NAME in out["result"]["message"]
    records = [json.loads(line) for line in
               (tmp_path / "state/evidence/evidence.jsonl").read_text().splitlines()]
    # and a checkpoint signed at shutdown by default (issue 32 item 10)
    assert [r["type"] for r in records] == ["begin", "end", "checkpoint"]
    assert records[1]["status"] == "error"
    assert records[1]["error_code"] == "PROVIDER.UNAVAILABLE"
    assert records[1]["sandbox_backend"] == NAME
    assert records[1]["budget_used"]["calls"] == 0  # refused before anything started
    text = cli(tmp_path, "run", "--config", "engine.yaml",
               "--policy", str(ROOT / "examples/policies/org.sbpolicy"),
               "--request", str(ROOT / "examples/requests/git-status.json"))
    assert text.returncode == 1
    assert REASON in text.stdout + text.stderr
    assert "Traceback" not in text.stderr


def test_plugins_lists_it_with_honest_capabilities_and_why_it_cannot_run(
        tmp_path: Path) -> None:
    proc = cli(tmp_path, "plugins", "--format", "json")
    info = json.loads(proc.stdout)
    ours = next(p for p in info["plugins"] if p["name"] == "executor_macos")
    assert ours["module"] == "plugins.executor_macos.plugin"
    (ex,) = ours["executors"]
    assert ex["name"] == NAME
    assert ex["unavailable"] == REASON
    caps = ex["capabilities"]
    assert caps["op_kinds"] == ["proc.exec"]
    assert caps["network_modes"] == ["off", "on"]  # no policy proxy: restricted runs as off
    assert caps["mandatory_denies"] is True
    assert caps["env_filtering"] is True
    assert caps["resource_limits"] is False  # macOS enforces no memory or pids limit
    assert caps["streaming_output"] is False
    text = cli(tmp_path, "plugins")
    assert f"executor {NAME}: ops proc.exec; network off, on;" in text.stdout
    assert f"UNAVAILABLE here: {REASON}" in text.stdout


def test_conformance_reports_the_unavailable_executor_once(tmp_path: Path) -> None:
    proc = cli(tmp_path, "conformance", "--executor", NAME)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"executor `{NAME}` is installed but unavailable on this host: {REASON}" \
        in proc.stderr
    assert "help: run the kit where the backend can run" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "FAIL" not in proc.stdout


def test_available_names_the_platform_or_the_missing_binary(tmp_path: Path) -> None:
    assert MacosSandboxExecutor().available() == REASON
    assert platform_reason("win32") == "sandbox-exec is macOS-only; this host is win32"
    assert platform_reason("darwin") is None
    missing = MacosSandboxExecutor(platform="darwin", sandbox_exec=str(tmp_path / "nope"))
    assert missing.available() == f"{tmp_path / 'nope'} is missing or not executable on this " \
                                  "macOS host"
    assert SANDBOX_EXEC == "/usr/bin/sandbox-exec"  # never looked up on PATH


def proc_profile(root: Path, *, env_names: tuple[str, ...] = ()) -> object:
    from policy_engine.model import ArgAlternative
    return make_profile(
        capabilities=(
            permit("fs.read", fs("fs.read", f"{root}/**")),
            permit("proc.exec", ProcCapability(
                tool="sh", env=tuple(ArgAlternative(literal=n) for n in env_names))),
        ),
        denies=(forbid(("fs.read", "fs.write", "fs.list"), fs("fs.read", "/home/agent/.ssh/**"),
                       rule="builtin:mandatory-secrets", mandatory=True),),
        root_fs=str(root), network=NetworkMode.OFF, limits=Limits(timeout_ms=5_000))


def test_the_launch_is_sandbox_exec_with_the_rendered_profile_and_a_clean_env(
        tmp_path: Path) -> None:
    profile = proc_profile(tmp_path, env_names=("GREETING",))
    ex = MacosSandboxExecutor()
    op = ProcExecOp(tool="sh", args=("-c", "echo hi"), env={"GREETING": "hello"},
                    timeout_ms=2_000)
    tmp = str(tmp_path / "scratch")
    launch = ex.launch(profile, op, tmpdir=tmp)  # type: ignore[arg-type]
    assert launch.argv[:2] == ["/usr/bin/sandbox-exec", "-p"]
    assert launch.argv[2] == launch.profile_text == render_sbpl(profile, tmpdir=tmp)  # type: ignore[arg-type]
    assert launch.argv[3:] == ["--", "sh", "-c", "echo hi"]
    assert launch.cwd == str(tmp_path)
    assert launch.timeout_s == 2.0  # the op's own timeout narrows the profile's 5 s
    assert launch.env["GREETING"] == "hello"
    assert launch.env["HOME"] == "/home/agent"
    assert launch.env["TMPDIR"] == tmp
    # nothing of the engine's environment leaks in: base keys, git pins, the allowed key
    assert set(launch.env) == {"PATH", "LANG", "TZ", "HOME", "TMPDIR", "GREETING", *GIT_PINS}


@pytest.mark.parametrize(("op", "code", "phrase"), [
    (ProcExecOp(tool="sh", env={"SECRET_TOKEN": "x"}), ErrorCode.CAPABILITY_BLOCKED,
     "SECRET_TOKEN"),
    (ProcExecOp(tool="sh", args=("a\x00b",)), ErrorCode.SCHEMA_VALIDATION_FAILED, "NUL"),
    (ProcExecOp(tool="sh", cwd="/etc"), ErrorCode.CAPABILITY_BLOCKED, "not beneath root_fs"),
])
def test_the_executor_rechecks_env_argv_and_cwd(tmp_path: Path, op: ProcExecOp,
                                                 code: ErrorCode, phrase: str) -> None:
    with pytest.raises(PolicyEngineError) as info:
        MacosSandboxExecutor().launch(proc_profile(tmp_path), op,  # type: ignore[arg-type]
                                      tmpdir=str(tmp_path))
    assert info.value.code == code
    assert phrase in info.value.reason


def test_a_path_sbpl_cannot_hold_refuses_the_call(tmp_path: Path) -> None:
    profile = make_profile(capabilities=(permit("fs.read", fs("fs.read", '/w/x"y/**')),),
                           root_fs="/w")
    with pytest.raises(PolicyEngineError) as info:
        MacosSandboxExecutor().launch(profile, ProcExecOp(tool="sh"), tmpdir=str(tmp_path))
    assert info.value.code == ErrorCode.CAPABILITY_BLOCKED
    assert "SBPL001" in info.value.reason


def test_options_are_validated() -> None:
    assert MacosOptions.parse({"env_allow": ["CI"], "extra_read": ["/opt/homebrew/**"]}) \
        .extra_read == ("/opt/homebrew/**",)
    for bad, phrase in (({"nope": 1}, "unknown options"), ({"extra_read": ["opt"]}, "absolute"),
                        ({"env_base": {"HOME": "/"}}, "PATH, LANG and TZ"),
                        ({"max_file_bytes": 0}, "positive")):
        with pytest.raises(ValueError, match=phrase):
            MacosOptions.parse(bad)


def test_execute_off_macos_refuses_before_anything_starts(tmp_path: Path) -> None:
    started: list[bool] = []
    ctx = ExecContext(profile=proc_profile(tmp_path), deadline=time.monotonic() + 5,  # type: ignore[arg-type]
                      on_start=lambda: started.append(True))
    with pytest.raises(PolicyEngineError) as info:
        MacosSandboxExecutor().execute(ctx, ProcExecOp(tool="sh"))
    assert info.value.code == ErrorCode.PROVIDER_UNAVAILABLE
    assert REASON in info.value.reason
    assert started == []


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """At the sandbox-exec path: keep the profile, drop ``-p PROFILE --``, exec the tool."""
    script = tmp_path / "sandbox-exec"
    script.write_text(f'#!/bin/sh\nprintf %s "$2" > {tmp_path}/profile.sb\nshift 3\nexec "$@"\n')
    script.chmod(0o755)
    return script


def run_op(tmp_path: Path, stand_in: Path, op: ProcExecOp, **limits: int) -> object:
    profile = proc_profile(tmp_path)
    ex = MacosSandboxExecutor(platform="darwin", sandbox_exec=str(stand_in))
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 30,  # type: ignore[arg-type]
                      limits=Limits(timeout_ms=limits.get("timeout_ms", 5_000),
                                    max_stdout_bytes=limits.get("max_stdout", 1 << 20),
                                    max_stderr_bytes=1 << 20, max_bytes_in=1 << 20))
    return ex.execute(ctx, op)


def test_run_path_output_exit_code_stdin_and_env(tmp_path: Path, stand_in: Path) -> None:
    op = ProcExecOp(tool="/bin/sh", args=("-c", "cat; echo err >&2; env | sort; exit 3"),
                    stdin_b64=base64.b64encode(b"from stdin\n").decode())
    result = run_op(tmp_path, stand_in, op)
    out = result.out  # type: ignore[attr-defined]
    assert out["exit_code"] == 3
    assert out["stdout"].startswith("from stdin\n")
    assert out["stderr"] == "err\n"
    assert "HOME=/home/agent" in out["stdout"]
    assert "PYTHONPATH" not in out["stdout"]
    assert out["backend"] == NAME
    assert out["network"] == "off"
    profile_text = (tmp_path / "profile.sb").read_text()
    assert out["isolation"]["profile_digest"]["size"] == len(profile_text.encode())
    assert "(deny default)" in profile_text
    forms = parse(profile_text)  # the mandatory deny of ~/.ssh holds, in any case (APFS)
    for secret in ("/home/agent/.ssh/id_rsa", "/home/agent/.SSH/id_rsa"):
        assert not decide(forms, Access("file-read-data", secret)), secret


def test_run_path_timeout_kills_the_whole_group(tmp_path: Path, stand_in: Path) -> None:
    marker = tmp_path / "orphan"
    op = ProcExecOp(tool="/bin/sh", args=("-c", f"(sleep 3; touch {marker}) & sleep 30"))
    start = time.monotonic()
    with pytest.raises(PolicyEngineError) as info:
        run_op(tmp_path, stand_in, op, timeout_ms=1_000)
    assert info.value.code == ErrorCode.TIMEOUT
    assert time.monotonic() - start < 5
    time.sleep(3.5)
    assert not marker.exists()  # the background child died with the group


def test_run_path_output_is_bounded_head_and_tail(tmp_path: Path, stand_in: Path) -> None:
    op = ProcExecOp(tool="/bin/sh", args=("-c", "head -c 100000 /dev/zero | tr '\\0' a; "
                                          "printf END"))
    out = run_op(tmp_path, stand_in, op, max_stdout=1000).out  # type: ignore[attr-defined]
    assert out["stdout_bytes"] == 100003
    assert out["stdout_truncated"] is True
    assert len(out["stdout"]) == 1000
    assert out["stdout"].endswith("END")


@pytest.mark.parametrize("mode", ["strict", "compat"])
def test_honest_declarations_refuse_in_strict_and_degrade_in_compat(
        tmp_path: Path, stand_in: Path, mode: str) -> None:
    """What ``resource_limits=False`` means on macOS: strict refuses a proc.exec (memory and
    pids cannot be limited), compat runs it and records why, through the real orchestrator."""
    from tests.unit.orchestrator_fixtures import MANIFEST, grant, orchestrator, profile
    ex = MacosSandboxExecutor(platform="darwin", sandbox_exec=str(stand_in))
    with orchestrator(tmp_path / "state", ex, prof=profile(), mode=mode) as orch:  # type: ignore[arg-type]
        got = orch.run(grant(), MANIFEST, ProcExecOp(tool="/bin/echo", args=("hi",)))
    if mode == "strict":
        assert got.result.code == "SANDBOX.CAPABILITY_BLOCKED"
        assert "`resource_limits`" in (got.result.message or "")
        assert got.end.budget_used.calls == 0
        assert not (tmp_path / "profile.sb").exists()  # sandbox-exec was never started
        return
    assert got.result.ok, got.result
    assert got.result.out["stdout"] == "hi\n"
    assert got.end.sandbox_backend == NAME
    assert got.end.sandbox_degraded is True
    assert "resource_limits" in (got.end.sandbox_degrade_reason or "")
    assert "(deny default)" in (tmp_path / "profile.sb").read_text()
