"""Seed 003's test cases ("## 测试用例"), run for real: each command goes through the sandbox
config's generated policy, the orchestrator and proc-bwrap on this machine.

Cases 8, 10 and 19 live with their backends (docs/sandbox-config.md has the index).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.model import Grant, Manifest, NetHttpCapability, NetHttpOp
from policy_engine.orchestrator import run_once
from policy_engine.sandbox_config.sbconfig import (
    DEFAULT_BLACKLIST,
    ENGINE_BLACKLIST,
    load_sandbox_config,
)
from policy_engine.sandbox_runner.runner import SandboxRunner
from tests.integration.servers import LoopbackServer, send

pytestmark = pytest.mark.integration

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- planted-secret-7f3a"
REAL_CACHE = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Any]:
    """A temp HOME with a planted key, a project (the cwd) and an engine state dir."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
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
    if config is not None:
        path.write_text(json.dumps(config))
    loaded = load_sandbox_config(path, env=env)
    assert not loaded.problems, loaded.problems
    return SandboxRunner(loaded, engine=box["engine"], env=env)


def sh(r: SandboxRunner, script: str, cwd: Path) -> Any:
    return r.run(["bash", "-c", script], str(cwd))


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer({"/": lambda h: send(h, 200, "text/plain", b"reached")}) as srv:
        yield srv


# ---- file system isolation ----------------------------------------------------------------

def test_seed003_case01_whitelisted_dir_is_readable_and_writable(box: dict[str, Any]) -> None:
    data = box["tmp"] / "data"
    data.mkdir()
    with runner(box, {"filesystem": {"whitelist": [str(data)]}}) as r:
        res = sh(r, f"echo written-inside > {data}/new.txt && cat {data}/new.txt && "
                    "echo in-cwd > here.txt && cat here.txt", box["proj"])
    assert res.exit_code == 0, res.stderr
    assert res.stdout == "written-inside\nin-cwd\n"
    assert res.backend == "proc-bwrap"
    assert not res.blocked
    assert (data / "new.txt").read_text() == "written-inside\n"  # really on the host
    assert (box["proj"] / "here.txt").read_text() == "in-cwd\n"


@pytest.mark.parametrize("read_outside", [False, True])
def test_seed003_case02_planted_ssh_key_is_refused(box: dict[str, Any],
                                                   read_outside: bool) -> None:
    key = box["home"] / ".ssh" / "id_rsa"
    with runner(box, {"filesystem": {"allowReadOutside": read_outside}}) as r:
        res = r.run(["cat", str(key)], str(box["proj"]))
        listing = r.run(["ls", "-a", str(key.parent)], str(box["proj"]))
    assert SECRET not in res.stdout + res.stderr
    assert res.exit_code != 0 or res.stdout == ""
    assert "id_rsa" not in listing.stdout
    assert key.read_text() == SECRET  # the host file is untouched


def test_seed003_case03_blacklist_inside_whitelist_wins(box: dict[str, Any]) -> None:
    proj = box["proj"]
    (proj / "token.txt").write_text("tok-secret-1")
    (proj / "private").mkdir()
    (proj / "private" / "k").write_text("priv-secret-2")
    (proj / ".env").write_text("API_KEY=env-secret-3")  # the seed default `**/.env`
    (proj / "open.txt").write_text("open")
    config = {"filesystem": {"whitelist": [str(proj)],
                             "blacklist": [str(proj / "token.txt"), str(proj / "private")]}}
    with runner(box, config) as r:
        read = sh(r, "cat token.txt private/k .env open.txt; ls -a private", proj)
        write = sh(r, "echo overwritten > token.txt", proj)
        decision, _profile, _op = r.decide(["cat", "x"], str(proj))
    for secret in ("tok-secret-1", "priv-secret-2", "env-secret-3"):
        assert secret not in read.stdout + read.stderr
    assert "open" in read.stdout  # the rest of the whitelisted tree is there
    assert write.exit_code != 0
    assert (proj / "token.txt").read_text() == "tok-secret-1"
    assert decision.allowed  # the command itself is allowed; the files inside are not


@pytest.fixture
def other() -> Iterator[Path]:
    """A directory outside the whitelist and outside /tmp (every sandbox has its own /tmp)."""
    where = Path(tempfile.mkdtemp(prefix="pe-seed003-", dir="/var/tmp"))
    where.chmod(0o755)  # an engine run as root runs its sandboxes as an unprivileged uid
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_seed003_case04_outside_whitelist_is_refused(box: dict[str, Any], other: Path) -> None:
    (other / "notes.txt").write_text("outside-content")
    with runner(box) as r:
        hidden = r.run(["cat", str(other / "notes.txt")], str(box["proj"]))
        write = sh(r, f"echo x > {other}/new.txt", box["proj"])
    assert "outside-content" not in hidden.stdout
    assert hidden.exit_code != 0
    assert write.exit_code != 0
    assert not (other / "new.txt").exists()
    with runner(box, {"filesystem": {"allowReadOutside": True}}) as r:
        readable = r.run(["cat", str(other / "notes.txt")], str(box["proj"]))
        write = sh(r, f"echo x > {other}/new.txt", box["proj"])
    assert readable.stdout == "outside-content"  # allowReadOutside: read-only elsewhere
    assert write.exit_code != 0
    assert "Read-only file system" in write.stderr
    assert not (other / "new.txt").exists()


# ---- network isolation -------------------------------------------------------------------

def test_seed003_case05_curl_in_the_sandbox_has_no_network(box: dict[str, Any],
                                                          server: LoopbackServer) -> None:
    url = server.url("/")
    host = subprocess.run(["curl", "-sS", "--max-time", "10", url], capture_output=True,
                          text=True, check=False)
    assert host.stdout == "reached"  # control: the server answers outside the sandbox
    # allowNetwork: true is ignored (loudly): the sandbox's network stays off
    with runner(box, {"network": {"allowNetwork": True}}) as r:
        assert any("allowNetwork" in n for n in r.loaded.notes)
        res = r.run(["curl", "-sS", "--max-time", "5", url], str(box["proj"]))
    assert res.exit_code != 0
    assert "reached" not in res.stdout
    assert res.extra["network"] == "off"
    assert len(server.seen.requests) == 1  # only the host's request


PING = r"""
import socket, struct, sys
try:
    try:  # unprivileged ICMP where ping_group_range allows it, else a raw socket (root)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except PermissionError:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.settimeout(3)
    s.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"ping", (sys.argv[1], 0))
    s.recvfrom(1024)
    print("pong")
except OSError as exc:
    print("no network:", exc)
    sys.exit(2)
"""


def test_seed003_case06_ping_in_the_sandbox_has_no_network(box: dict[str, Any],
                                                          server: LoopbackServer) -> None:
    # no `ping` binary on this machine: an ICMP echo from Python, and bash's /dev/tcp
    host = subprocess.run([sys.executable, "-c", PING, "127.0.0.1"], capture_output=True,
                          text=True, check=False)
    assert host.stdout.strip() == "pong", host  # control: ICMP works on the host
    with runner(box) as r:
        res = r.run([sys.executable, "-c", PING, "127.0.0.1"], str(box["proj"]))
        tcp = sh(r, f"echo hi > /dev/tcp/127.0.0.1/{server.port}", box["proj"])
    assert res.exit_code != 0
    assert "pong" not in res.stdout
    assert tcp.exit_code != 0
    assert server.seen.requests == []


def test_seed003_case07_engine_net_http_outside_the_sandbox_works(
        box: dict[str, Any], server: LoopbackServer) -> None:
    policy = box["tmp"] / "agent.sbpolicy"
    policy.write_text('policy "agent/commands" version "1.0.0"\n'
                      f'permit "fetch-local" net.http hosts ["127.0.0.1"] schemes ["http"] '
                      f'ports [{server.port}] methods ["GET"]\n')
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(server.port,),
                            methods=("GET",))
    manifest = Manifest(name="fetch", version="1", permissions=(cap,), network="on")
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="fetch", call_id="c-7",
                  capabilities=(cap,), expires_at=4_102_444_800_000)
    out = run_once(compile_files([policy]), grant, manifest, NetHttpOp(url=server.url("/")),
                   config=box["engine"])
    assert out.result.ok, out.result
    assert out.end.sandbox_backend == "http"
    assert [p for _m, p, _h in server.seen.requests] == ["/"]


# ---- platform adapters ----------------------------------------------------------------------

def test_seed003_case09_bwrap_argv_is_built_from_the_config(box: dict[str, Any]) -> None:
    data = box["tmp"] / "data"
    data.mkdir()
    (box["proj"] / ".env").write_text("X=1")
    with runner(box, {"filesystem": {"whitelist": [str(data)]}}) as r:
        shown = r.preview(["ls", "-l"], str(box["proj"]))
    assert shown["decision"] == "allow"
    assert shown["backend"] == "proc-bwrap"
    argv: list[str] = shown["argv"]
    bwrap = argv[argv.index(next(a for a in argv if a.endswith("/bwrap"))):]
    assert "--unshare-all" in bwrap
    assert "--share-net" not in bwrap
    assert "--cap-drop" in bwrap
    assert "--die-with-parent" in bwrap
    pairs = list(zip(bwrap, bwrap[1:], bwrap[2:], strict=False))
    assert any(f == "--bind" and d == str(box["proj"]) for f, _s, d in pairs)  # cwd, writable
    assert any(f == "--bind" and d == str(data) for f, _s, d in pairs)  # whitelist, writable
    assert ("--ro-bind", "/dev/null", str(box["proj"] / ".env")) in pairs  # masked
    assert not any(f in ("--bind", "--ro-bind") and d == str(box["home"])
                   for f, _s, d in pairs)  # home not bound
    assert bwrap[bwrap.index("--chdir") + 1] == str(box["proj"])
    assert bwrap[-2:] == ["ls", "-l"]
    cli = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "sandbox", "profile", "--platform", "linux",
         "--config", str(box["tmp"] / "sandbox.json"), "--state-dir", str(box["tmp"] / "st2"),
         "--cwd", str(box["proj"]), "--format", "json", "--", "ls", "-l"],
        capture_output=True, text=True, env={**os.environ, **box["env"]}, check=False)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["argv"][-2:] == ["ls", "-l"]


def test_sandbox_profile_platform_macos_renders_the_same_decision_as_sbpl(
        box: dict[str, Any]) -> None:
    """`sandbox profile --platform macos`: the sandbox-exec profile of the same compiled policy
    (seed 003's macOS adapter), here on Linux where nothing runs it: the whitelist writable,
    the blacklisted file inside it denied after every allow, the network denied."""
    import sexpdata

    data = box["tmp"] / "data"
    data.mkdir()
    (box["proj"] / ".env").write_text("X=1")
    (box["tmp"] / "sandbox.json").write_text(json.dumps({"filesystem": {"whitelist": [str(data)]}}))
    cli = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "sandbox", "profile", "--platform", "macos",
         "--config", str(box["tmp"] / "sandbox.json"), "--state-dir", str(box["tmp"] / "st3"),
         "--cwd", str(box["proj"]), "--format", "json", "--", "ls", "-l"],
        capture_output=True, text=True, env={**os.environ, **box["env"]}, check=False)
    assert cli.returncode == 0, cli.stderr
    shown = json.loads(cli.stdout)
    assert shown["platform"] == "macos"
    assert shown["decision"] == "allow"
    sbpl: str = shown["sbpl"]
    assert shown["argv"] == ["/usr/bin/sandbox-exec", "-p", sbpl, "--", "ls", "-l"]
    forms = sexpdata.loads("(" + sbpl + ")")  # one balanced S-expression list
    assert [str(f[0]) for f in forms[:2]] == ["version", "deny"]
    lines = sbpl.splitlines()
    write_data = next(i for i, ln in enumerate(lines) if f'(subpath "{data}")' in ln
                      and "file-write" in "".join(lines[i - 3:i + 1]))
    # **/.env: a deny regex in any case (APFS is case-insensitive), named forks beneath
    deny_env = next(i for i, ln in enumerate(lines) if r"(/[^/]+)*/\.[Ee][Nn][Vv](" in ln)
    opening = next(ln for ln in reversed(lines[:deny_env]) if ln.startswith(("(allow", "(deny")))
    assert opening.startswith("(deny file-read* file-write*")
    assert deny_env > write_data  # last match wins: the blacklist entry comes after the allow
    assert "(allow network" not in sbpl
    text = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "sandbox", "profile", "--platform", "macos",
         "--config", str(box["tmp"] / "sandbox.json"), "--state-dir", str(box["tmp"] / "st3"),
         "--cwd", str(box["proj"]), "--", "ls"],
        capture_output=True, text=True, env={**os.environ, **box["env"]}, check=False)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("decision: allow")
    assert "(deny default)" in text.stdout


# ---- configuration loading --------------------------------------------------------------------

def test_seed003_case11_default_blacklist_has_the_secret_dirs(box: dict[str, Any]) -> None:
    loaded = load_sandbox_config(env=box["env"])
    home = str(box["home"])
    paths = {e.path for e in loaded.config.blacklist}
    for want in (f"{home}/.ssh", f"{home}/.aws", f"{home}/.gnupg", f"{home}/.config/gcloud",
                 f"{home}/.azure", "/etc/passwd", "/etc/shadow", "**/.env",
                 "**/credentials.json", "**/secrets.json"):
        assert want in paths
    assert len(loaded.config.blacklist) == len(DEFAULT_BLACKLIST + ENGINE_BLACKLIST)
    assert loaded.config.enabled
    assert not loaded.config.allow_read_outside
    assert not loaded.config.allow_network


def test_seed003_case12_user_config_merges_and_cannot_lift_defaults(
        box: dict[str, Any]) -> None:
    data = box["tmp"] / "data"
    data.mkdir()
    with runner(box, {"enabled": True, "filesystem": {
            "whitelist": [str(data)], "blacklist": ["~/.kube", "~/.docker", "~/.team-secrets"],
            "allowReadOutside": True}}) as r:
        c = r.loaded.config
        key = r.run(["cat", str(box["home"] / ".ssh" / "id_rsa")], str(box["proj"]))
    paths = [e.path for e in c.blacklist]
    defaults = [e.path for e in load_sandbox_config(env=box["env"]).config.blacklist]
    assert paths[:len(defaults)] == defaults  # the defaults first, all of them
    # the seed's example entries (already engine defaults: kept once) and a new one
    assert f"{box['home']}/.kube" in defaults
    assert f"{box['home']}/.docker" in defaults
    assert paths[len(defaults):] == [f"{box['home']}/.team-secrets"]
    assert [e.path for e in c.whitelist] == [str(data)]
    assert c.allow_read_outside
    assert SECRET not in key.stdout
    # an empty blacklist removes nothing
    with runner(box, {"filesystem": {"blacklist": []}}) as r:
        assert len(r.loaded.config.blacklist) == len(DEFAULT_BLACKLIST + ENGINE_BLACKLIST)


def test_seed003_case13_missing_file_means_defaults(box: dict[str, Any]) -> None:
    env = {**box["env"], "POLICY_ENGINE_SANDBOX_CONFIG": str(box["tmp"] / "absent.json")}
    loaded = load_sandbox_config(env=env)
    assert not loaded.found
    assert not loaded.fallback
    assert not loaded.problems
    assert loaded.path == str(box["tmp"] / "absent.json")
    assert len(loaded.config.blacklist) == len(DEFAULT_BLACKLIST + ENGINE_BLACKLIST)
    with SandboxRunner(loaded, engine=box["engine"], env=env) as r:
        res = r.run(["echo", "ok"], str(box["proj"]))
    assert res.stdout == "ok\n"


def test_seed003_case14_malformed_file_falls_back_loudly(box: dict[str, Any]) -> None:
    path = box["tmp"] / "sandbox.json"
    path.write_text('{\n  "filesystem": {\n    "whitelist": ["/", ]\n  }\n}\n')
    env = {**box["env"], "POLICY_ENGINE_SANDBOX_CONFIG": str(path)}
    loaded = load_sandbox_config(env=env)
    assert loaded.found
    assert loaded.fallback
    assert [(d.id, d.span.line if d.span else 0) for d in loaded.problems] == [("SBP105", 3)]
    assert loaded.config.whitelist == ()  # strict defaults
    cli = subprocess.run(
        [sys.executable, "-m", "policy_engine.cli", "sandbox", "exec",
         "--state-dir", str(box["tmp"] / "st"), "--cwd", str(box["proj"]), "--",
         "cat", str(box["home"] / ".ssh" / "id_rsa")],
        capture_output=True, text=True, env={**os.environ, **env}, check=False)
    assert f"{path}:3:" in cli.stderr
    assert "strict defaults are in force" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert SECRET not in cli.stdout
    check = subprocess.run([sys.executable, "-m", "policy_engine.cli", "sandbox", "check",
                            str(path)], capture_output=True, text=True, check=False,
                           env={**os.environ, **env})
    assert check.returncode == 1
    assert f"{path}:3:" in check.stdout


# ---- violations ---------------------------------------------------------------------------------

def test_seed003_case15_blocked_is_a_permission_error(box: dict[str, Any]) -> None:
    with runner(box) as r:
        home_cwd = r.run(["ls"], str(box["home"]))  # would make ~ writable
        shell = r.run(["ls; cat ~/.ssh/id_rsa"], str(box["proj"]))  # a shell string
    assert home_cwd.blocked
    assert home_cwd.code == "SANDBOX.CAPABILITY_BLOCKED"
    assert home_cwd.stderr.startswith("Permission denied:")
    assert home_cwd.exit_code == 1
    assert shell.blocked
    assert shell.code == "POLICY.DENY_TOOL"
    assert shell.stdout == ""
    assert shell.envelope_id is not None  # decided by the guard, with evidence
    records = [json.loads(x) for x in (box["engine"].state_dir / "evidence" /
                                       "evidence.jsonl").read_text().splitlines()]
    records = [r for r in records if r["type"] != "checkpoint"]  # signed at close by default
    assert records[-1]["status"] == "denied"
    assert records[-2]["annotations"]["sandbox_config"]["fallback_to_defaults"] is False


def test_seed003_case16_a_violation_does_not_stop_the_next_command(
        box: dict[str, Any]) -> None:
    with runner(box) as r:
        first = r.run(["cat", str(box["home"] / ".ssh" / "id_rsa")], str(box["proj"]))
        blocked = r.run(["ls"], "/")
        after = r.run(["echo", "still running"], str(box["proj"]))
    assert SECRET not in first.stdout
    assert blocked.blocked
    assert after.exit_code == 0
    assert after.stdout == "still running\n"


# ---- edge cases ---------------------------------------------------------------------------------

def test_seed003_case17_env_vars_in_paths_are_expanded(box: dict[str, Any]) -> None:
    work = box["tmp"] / "work-area"
    (work / "sub").mkdir(parents=True)
    config = {"filesystem": {"whitelist": ["$WORK_ROOT/sub"],
                             "blacklist": ["${WORK_ROOT}/sub/hidden.txt"]}}
    (work / "sub" / "hidden.txt").write_text("var-secret")
    with runner(box, config, WORK_ROOT=str(work)) as r:
        assert [e.path for e in r.loaded.config.whitelist] == [str(work / "sub")]
        res = sh(r, f"echo via-var > {work}/sub/out.txt; cat {work}/sub/hidden.txt",
                 box["proj"])
    assert (work / "sub" / "out.txt").read_text() == "via-var\n"
    assert "var-secret" not in res.stdout


def test_seed003_case18_tilde_expands_to_home(box: dict[str, Any]) -> None:
    (box["home"] / "work").mkdir()
    with runner(box, {"filesystem": {"whitelist": ["~/work"]}}) as r:
        assert [e.path for e in r.loaded.config.whitelist] == [str(box["home"] / "work")]
        res = sh(r, f"echo tilde > {box['home']}/work/t.txt", box["proj"])
    assert res.exit_code == 0, res.stderr
    assert (box["home"] / "work" / "t.txt").read_text() == "tilde\n"

