"""Attacks on the sandbox config's boundary, run for real through proc-bwrap: what the runner
adds by itself (the working directory, ``$TMPDIR``), symlinks inside a whitelisted tree, odd
command names, and the CLI's refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from policy_engine.config import EngineConfig
from policy_engine.sandbox_config.sbconfig import load_sandbox_config
from policy_engine.sandbox_runner.runner import SandboxDisabledError, SandboxRunner

pytestmark = pytest.mark.integration

SECRET = "planted-key-material-0b7e"
REAL_CACHE = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Any]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    (home / ".aws").mkdir()
    proj = home / "proj"
    proj.mkdir()
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "XDG_CACHE_HOME": REAL_CACHE}
    return {"home": home, "proj": proj, "env": env, "tmp": tmp_path,
            "engine": EngineConfig(state_dir=tmp_path / "state", budget_meter="memory")}


def runner(box: dict[str, Any], config: dict[str, Any] | None = None,
           **extra_env: str) -> SandboxRunner:
    env = {**box["env"], **extra_env}
    path = box["tmp"] / "sandbox.json"
    path.write_text(json.dumps(config or {}))
    return SandboxRunner(load_sandbox_config(path, env=env), engine=box["engine"], env=env)


@pytest.mark.parametrize("tmpdir", ["/etc", "/", "HOME", "/usr/lib"])
def test_tmpdir_never_whitelists_a_system_tree_or_home(box: dict[str, Any],
                                                      tmpdir: str) -> None:
    tmpdir = str(box["home"]) if tmpdir == "HOME" else tmpdir
    with runner(box, TMPDIR=tmpdir) as r:
        policy = r.policy_for(["touch"], str(box["proj"]))
        probe = os.path.join(tmpdir, "pe-sandbox-probe")
        res = r.run(["touch", probe], str(box["proj"]))
    assert f'"{tmpdir.rstrip("/")}/**"' not in policy.source
    assert [e.origin for e in policy.writable] == ["working directory"]
    # (a parent of a bind, such as the home above the project, exists inside the sandbox as
    # an empty directory of bwrap's own root: a write there may succeed and reaches no host)
    assert not os.path.exists(probe), res


def test_tmpdir_elsewhere_is_whitelisted_as_the_seed_does(box: dict[str, Any]) -> None:
    scratch = box["tmp"] / "scratch"
    scratch.mkdir()
    with runner(box, TMPDIR=str(scratch)) as r:
        res = r.run(["touch", str(scratch / "made")], str(box["proj"]))
    assert res.exit_code == 0, res.stderr
    assert (scratch / "made").exists()


@pytest.mark.parametrize("read_outside", [False, True])
def test_symlink_to_ssh_inside_a_whitelisted_tree_reads_nothing(box: dict[str, Any],
                                                                 read_outside: bool) -> None:
    (box["proj"] / "keys").symlink_to(box["home"] / ".ssh")
    (box["proj"] / "key").symlink_to(box["home"] / ".ssh" / "id_rsa")
    with runner(box, {"filesystem": {"allowReadOutside": read_outside}}) as r:
        res = r.run(["cat", "keys/id_rsa", "key"], str(box["proj"]))
        copy = r.run(["cp", "key", "stolen"], str(box["proj"]))
    assert SECRET not in res.stdout + res.stderr
    assert copy.exit_code != 0 or SECRET not in (box["proj"] / "stolen").read_text()


@pytest.mark.parametrize("where", ["aws", "etc-link", "quote", "slash"])
def test_a_working_directory_that_cannot_be_whitelisted_is_refused(box: dict[str, Any],
                                                                   where: str) -> None:
    cwd = {"aws": box["home"] / ".aws", "etc-link": box["proj"] / "etc",
           "quote": box["proj"] / 'a"b', "slash": Path("/")}[where]
    if where == "etc-link":
        cwd.symlink_to("/etc")
    elif where == "quote":
        cwd.mkdir()
    with runner(box) as r:
        res = r.run(["touch", "x"], str(cwd))
        after = r.run(["true"], str(box["proj"]))
    assert res.blocked, res
    assert res.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert res.stderr.startswith("Permission denied:")
    assert not (cwd / "x").exists() if where != "slash" else not Path("/x").exists()
    assert after.exit_code == 0
    assert not after.blocked


@pytest.mark.parametrize("tool", ["a\nb", "ls;id", "", 'x"y', "../bin/sh"])
def test_odd_command_names_are_refused_not_internal_errors(box: dict[str, Any],
                                                          tool: str) -> None:
    with runner(box) as r:
        res = r.run([tool, "-l"], str(box["proj"]))
    assert res.exit_code == 1
    assert res.blocked or res.code == "SCHEMA.VALIDATION_FAILED", res
    assert res.code in ("POLICY.DENY_TOOL", "SCHEMA.VALIDATION_FAILED"), res
    if tool:  # decided by the guard, recorded in the evidence
        assert res.envelope_id is not None


def test_disabled_sandbox_refuses_instead_of_running_unconfined(box: dict[str, Any]) -> None:
    with runner(box, {"enabled": False}) as r, pytest.raises(SandboxDisabledError) as err:
        r.run(["touch", str(box["home"] / "pwned")], str(box["proj"]))
    assert "never runs a command unconfined" in err.value.reason
    assert not (box["home"] / "pwned").exists()
    cli = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "sandbox", "exec", "--state-dir",
         str(box["tmp"] / "st"), "--cwd", str(box["proj"]), "--", "touch",
         str(box["home"] / "pwned")],
        capture_output=True, text=True, check=False,
        env={**os.environ, **box["env"], "POLICY_ENGINE_SANDBOX_ENABLED": "0"})
    assert cli.returncode == 2
    assert "POLICY_ENGINE_SANDBOX_ENABLED" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert not (box["home"] / "pwned").exists()


def test_cli_show_reports_origins_and_the_generated_policy(box: dict[str, Any]) -> None:
    path = box["tmp"] / "sandbox.json"
    path.write_text('{"filesystem": {"blacklist": ["~/.vlt"]}, "network": {"allowNetwork": true}}')
    out = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "sandbox", "show", "--config", str(path),
         "--state-dir", str(box["tmp"] / "st"), "--cwd", str(box["proj"]), "--format", "json"],
        capture_output=True, text=True, check=False, env={**os.environ, **box["env"]})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["file"] == str(path)
    assert data["located_by"] == "--config"
    assert data["network"] == {"allowNetwork": False, "requested": True}
    assert "allowNetwork" in out.stderr  # said loudly
    kube = data["filesystem"]["blacklist"][-1]
    assert kube["written"] == "~/.vlt"
    assert kube["origin"] == f"{path}:1:31"
    assert data["run_whitelist"][0] == {"written": str(box["proj"]), "path": str(box["proj"]),
                                        "origin": "working directory"}
    assert 'forbid mandatory "sandbox-blacklist"' in data["policy"]
    assert Path(data["policy_file"]).read_text() == data["policy"]


def test_cli_exec_bad_input_is_not_a_permission_error(box: dict[str, Any]) -> None:
    base = [sys.executable, "-m", "policy_engine.cli", "sandbox", "exec", "--state-dir",
            str(box["tmp"] / "st")]
    env = {**os.environ, **box["env"]}
    missing = subprocess.run([*base, "--cwd", str(box["tmp"] / "nope"), "--", "true"],
                             capture_output=True, text=True, check=False, env=env)
    assert missing.returncode == 2
    assert "is not a directory" in missing.stderr
    assert "Permission denied" not in missing.stderr
    ran = subprocess.run([*base, "--cwd", str(box["proj"]), "--", "bash", "-c", "exit 7"],
                         capture_output=True, text=True, check=False, env=env)
    assert ran.returncode == 7  # the command's own exit code


@pytest.mark.parametrize(("argv", "code"), [(["ls;id"], "POLICY.DENY_TOOL"), (["ls"], None)])
def test_preview_decides_as_the_run_does(box: dict[str, Any], argv: list[str],
                                         code: str | None) -> None:
    with runner(box) as r:
        shown = r.preview(argv, str(box["proj"]))
        ran = r.run(argv, str(box["proj"]))
    assert shown["code"] == code
    assert ran.code == code
    assert shown["rule"] == ran.rule


def test_the_api_warns_about_a_refused_file(box: dict[str, Any],
                                            caplog: pytest.LogCaptureFixture) -> None:
    path = box["tmp"] / "sandbox.json"
    path.write_text('{"filesystem": {"whitelist": ["/"]}}')
    loaded = load_sandbox_config(path, env=box["env"])
    with caplog.at_level("WARNING"), SandboxRunner(loaded, engine=box["engine"],
                                                   env=box["env"]) as r:
        res = r.run(["true"], str(box["proj"]))
    assert res.exit_code == 0  # strict defaults: still runs
    assert any(f"{path}:1:31" in m and "strict defaults" in m for m in caplog.messages)


def test_the_engine_state_inside_the_working_directory_is_out_of_reach(
        box: dict[str, Any]) -> None:
    # the default state dir is ./var: run from a project, the evidence, its key and the budgets
    # would lie in the writable working directory of the very commands they record
    state = box["proj"] / "var"
    engine = EngineConfig(state_dir=state, budget_meter="sqlite")
    env = box["env"]
    loaded = load_sandbox_config(box["tmp"] / "none.json", env=env)
    with SandboxRunner(loaded, engine=engine, env=env) as r:
        first = r.run(["true"], str(box["proj"]))
        log = state / "evidence" / "evidence.jsonl"
        before = log.read_bytes()
        key = next(p for p in state.rglob("*") if p.is_file() and "key" in p.name)
        attack = r.run(["bash", "-c", "ls -la var var/*; cat var/keys/* var/*key* | od -c | "
                        "head -3; echo forged >> var/evidence/evidence.jsonl; "
                        "rm -rf var/evidence var/sandbox; echo done"], str(box["proj"]))
        after = log.read_bytes()
    assert first.exit_code == 0
    assert attack.stdout.rstrip().endswith("done")  # it ran, and could do none of it:
    assert after.startswith(before)  # nothing the sandbox wrote reached the log
    assert b"forged" not in after
    assert key.read_bytes()
    assert key.stat().st_uid == os.getuid()
    assert (state / "sandbox").is_dir()


def test_a_working_directory_inside_the_state_directory_is_refused(box: dict[str, Any]) -> None:
    inside = box["engine"].state_dir / "work"
    inside.mkdir(parents=True)
    with runner(box) as r:
        res = r.run(["touch", "x"], str(inside))
    assert res.blocked
    assert "state directory" in (res.blocked_reason or "")
    assert not (inside / "x").exists()


@pytest.mark.parametrize("rel", [".git-credentials", ".netrc", ".docker/config.json",
                                 ".kube/config", ".config/gh/hosts.yml"])
def test_read_outside_does_not_show_well_known_credentials(box: dict[str, Any],
                                                           rel: str) -> None:
    # a home outside /tmp (every sandbox has its own /tmp), world-readable, so that only the
    # sandbox's own rules keep the file out (the sandbox uid is not its owner under root)
    home = Path(tempfile.mkdtemp(prefix="pe-home-", dir="/var/tmp"))
    try:
        target = home / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("https://user:ghp_tok3n@github.com\n")
        (home / "notes.txt").write_text("plain")
        for p in (home, *(q for q in target.parents if str(q).startswith(str(home)))):
            p.chmod(0o755)
        for f in (target, home / "notes.txt"):
            f.chmod(0o644)
        env = {**box["env"], "HOME": str(home)}
        path = box["tmp"] / "sandbox.json"
        path.write_text(json.dumps({"filesystem": {"allowReadOutside": True}}))
        with SandboxRunner(load_sandbox_config(path, env=env), engine=box["engine"],
                           env=env) as r:
            res = r.run(["cat", str(home / "notes.txt"), str(target)], str(box["proj"]))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert "plain" in res.stdout  # reading outside works...
    assert "tok3n" not in res.stdout  # ...but not the credential files


MORE_CREDENTIALS = (".vault-token", ".pgpass", ".cargo/credentials.toml", ".cargo/credentials",
                    ".terraform.d/credentials.tfrc.json", ".config/rclone/rclone.conf", ".s3cfg",
                    ".boto", ".config/containers/auth.json", ".gem/credentials", ".config/hub",
                    ".m2/settings.xml", ".my.cnf", ".mylogin.cnf", ".config/composer/auth.json",
                    ".composer/auth.json", ".oci/config", ".config/doctl/config.yaml")


def test_read_outside_hides_the_other_common_credential_files(box: dict[str, Any]) -> None:
    """Round-3 attack F15: with `allowReadOutside`, 12 common credential files (vault, pgpass,
    cargo, terraform, rclone, s3cmd, boto, containers, gem, hub, maven, mysql) were readable."""
    home = Path(tempfile.mkdtemp(prefix="pe-home-", dir="/var/tmp"))
    try:
        for i, rel in enumerate(MORE_CREDENTIALS):
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"MARKER_{i}_s3cr3t\n")
        (home / "notes.txt").write_text("plain")
        for p in (home, *home.rglob("*")):
            p.chmod(0o755 if p.is_dir() else 0o644)
        env = {**box["env"], "HOME": str(home)}
        path = box["tmp"] / "sandbox.json"
        path.write_text(json.dumps({"filesystem": {"allowReadOutside": True}}))
        with SandboxRunner(load_sandbox_config(path, env=env), engine=box["engine"],
                           env=env) as r:
            res = r.run(["bash", "-c", f"cd {home}; cat notes.txt; for f in "
                         + " ".join(MORE_CREDENTIALS) + "; do cat $f; done; true"],
                        str(box["proj"]))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert "plain" in res.stdout, res  # reading outside works...
    assert "s3cr3t" not in res.stdout  # ...but none of the credential files


def test_the_evidence_names_the_runners_subject(box: dict[str, Any]) -> None:
    loaded = load_sandbox_config(box["tmp"] / "none.json", env=box["env"])
    with SandboxRunner(loaded, engine=box["engine"], env=box["env"],
                       subject="agent:builder-7") as r:
        res = r.run(["true"], str(box["proj"]))
    assert res.exit_code == 0
    begin = json.loads((box["engine"].state_dir / "evidence" / "evidence.jsonl")
                       .read_text().splitlines()[0])
    assert begin["subject_id"] == "agent:builder-7"


@pytest.mark.parametrize("name", [b"p\nq", b"p\xff", b"p\x1bq"])
def test_a_working_directory_with_control_characters_or_bad_utf8_is_refused(
        box: dict[str, Any], name: bytes) -> None:
    """Round-3 attack F11: a newline in the cwd reached the generated policy (an internal
    error, after writing the policy file); a non-UTF-8 cwd gave a raw codec message."""
    where = os.path.join(os.fsencode(box["proj"]), name)
    os.mkdir(where)
    with runner(box) as r:
        res = r.run(["true"], os.fsdecode(where))
    assert res.blocked
    assert res.code == "SANDBOX.CAPABILITY_BLOCKED", res
    assert "working directory" in (res.blocked_reason or "")
    for platform in ("linux", "macos"):
        cli = subprocess.run(
            [sys.executable, "-m", "policy_engine.cli", "sandbox", "profile", "--platform",
             platform, "--state-dir", str(box["tmp"] / "st-f11"), "--", "true"],
            capture_output=True, env={**os.environ, **box["env"]}, cwd=where, check=False)
        assert cli.returncode == 1, cli.stderr
        assert b"SANDBOX.CAPABILITY_BLOCKED" in cli.stderr
        assert b"Traceback" not in cli.stderr
