"""The engine's own trees (launcher cache, state, sandbox config) out of a sandbox's reach, run
for real through proc-bwrap (outsider attack round 3, F7 and F8)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_proc import native
from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.sandbox_config.sbconfig import load_sandbox_config
from policy_engine.sandbox_runner.runner import SandboxRunner
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

# replaces the launcher from inside the sandbox with a script that, run by the engine (root on
# the host), writes `id` into PWNED and then execs the original so the command still works
EVIL = (r'd={bin}; f=$(ls $d/sb_launch-* | head -1); cp $f $d/.orig && '
        r'''printf '#!/bin/sh\nid > {pwned} 2>&1\nexec %s/.orig "$@"\n' $d > $d/.new && '''
        r'chmod 755 $d/.new $d/.orig && mv -f $d/.new $f && echo replaced')


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    home = tmp_path / "home"
    proj = home / "proj"
    proj.mkdir(parents=True)
    (home / ".config" / "policy-engine").mkdir(parents=True)
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    monkeypatch.delenv("POLICY_ENGINE_STATE", raising=False)
    return {"home": home, "proj": proj, "env": env, "tmp": tmp_path,
            "engine": EngineConfig(state_dir=tmp_path / "state", budget_meter="memory")}


def _runner(box: dict[str, Any], config: dict[str, Any], env: dict[str, str]) -> SandboxRunner:
    path = Path(env["HOME"]) / ".config" / "policy-engine" / "sandbox.json"
    path.write_text(json.dumps(config))
    return SandboxRunner(load_sandbox_config(path, env=env), engine=box["engine"], env=env)


@pytest.mark.parametrize("how", ["whitelist", "tmpdir", "xdg-in-project"])
def test_a_sandboxed_command_never_replaces_the_launcher(box: dict[str, Any], how: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    home, proj = box["home"], box["proj"]
    cache = proj / ".cache" if how == "xdg-in-project" else home / ".cache"
    env = {**box["env"], "XDG_CACHE_HOME": str(cache)}
    config: dict[str, Any] = {"filesystem": {"whitelist": ["~/proj"]}}
    if how == "whitelist":
        config["filesystem"]["whitelist"].append("~/.cache")
    if how == "tmpdir":
        cache.mkdir()
        env["TMPDIR"] = str(cache)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))  # where the engine caches its launcher
    pwned = box["tmp"] / "PWNED"
    bindir = cache / "policy-engine" / "bin"
    with _runner(box, config, env) as r:
        results = [r.run(cmd, str(proj)) for cmd in (
            ["true"], ["bash", "-c", EVIL.format(bin=bindir, pwned=pwned)],
            ["bash", "-c", "echo third"])]
    assert not pwned.exists(), (pwned.read_text(), results)
    # the launcher (when one was built) stayed the engine's, writable by nobody else
    for f in bindir.glob("sb_launch-*") if bindir.is_dir() else ():
        st = f.stat()
        assert (st.st_uid, st.st_mode & 0o022) == (os.geteuid(), 0), f
    assert "replaced" not in results[1].stdout
    # refused with a stable code naming the engine's tree, or it ran and could not write there
    assert all(res.code in (None, "SANDBOX.CAPABILITY_BLOCKED") for res in results), results


def test_sandbox_check_refuses_a_whitelist_holding_the_launcher_cache(box: dict[str, Any]) -> None:
    path = box["home"] / ".config" / "policy-engine" / "sandbox.json"
    path.write_text(json.dumps({"filesystem": {"whitelist": ["~/proj", "~/.cache"]}}))
    loaded = load_sandbox_config(path, env=box["env"])
    assert loaded.problems, "the file was accepted"
    assert "launcher" in " ".join(p.message for p in loaded.problems)


def test_proc_refuses_a_writable_bind_holding_its_launcher(tmp_path: Path) -> None:
    # any policy, not only sandbox.json: fs.write over the tree the launcher is cached in
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    (root / "home").mkdir()
    cache = root / "out" / "cache"
    ex = ProcExecutor("bwrap", ProcOptions(launcher_cache=str(cache), prespawn=0))
    try:
        ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
        with pytest.raises(PolicyEngineError) as exc:
            ex.execute(ctx, ProcExecOp(tool="true", cwd=str(root / "out")))
    finally:
        ex.close()
    assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED
    assert "launcher" in exc.value.reason
    for p in [cache, *cache.rglob("*")] if cache.exists() else []:
        assert p.stat().st_uid == os.geteuid(), p  # nothing handed to the sandbox uid


@pytest.mark.parametrize("prespawn", [0, 2])
def test_a_launcher_changed_after_the_probe_is_never_executed(tmp_path: Path,
                                                              prespawn: int) -> None:
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    (root / "home").mkdir()
    cache = tmp_path / "cache"
    ex = ProcExecutor("bwrap", ProcOptions(launcher_cache=str(cache), prespawn=prespawn))
    try:
        ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
        op = ProcExecOp(tool="true", cwd=str(root / "out"))
        assert ex.execute(ctx, op).ok
        exe = native.launcher(cache).path
        assert exe is not None
        pwned = tmp_path / "PWNED"
        os.rename(exe, exe + ".orig")
        Path(exe).write_text(f'#!/bin/sh\nid > {pwned}\nexec {exe}.orig "$@"\n')
        os.chmod(exe, 0o777)  # what a swap by another uid looks like: group/other writable
        for _ in range(3):
            with pytest.raises(PolicyEngineError) as exc:
                ex.execute(ExecContext(profile=make_profile(root),
                                       deadline=time.monotonic() + 60), op)
            assert exc.value.code == ErrorCode.PROVIDER_UNAVAILABLE
            assert "launcher" in exc.value.reason
        time.sleep(0.2)  # a held launcher refilled in the background would have run by now
    finally:
        ex.close()
    assert not pwned.exists()



REWRITE = ("echo '{\"filesystem\": {\"whitelist\": [\"~/proj\"], \"allowReadOutside\": true}}' > "
           "{conf} && echo rewritten; mkdir -p {hooks} && echo x > {hooks}/evil.desktop && "
           "echo hooked")


@pytest.mark.parametrize("how", ["config-home", "named-in-project", "autostart"])
def test_a_sandboxed_command_never_rewrites_its_config_or_login_hooks(
        box: dict[str, Any], how: str) -> None:
    home, proj = box["home"], box["proj"]
    env = dict(box["env"])
    conf = home / ".config" / "policy-engine" / "sandbox.json"
    white = ["~/proj", "~/.config"] if how == "config-home" else ["~/proj"]
    if how == "autostart":
        white.append("~/.config/autostart")
    if how == "named-in-project":
        conf = proj / "sandbox.json"
        env["POLICY_ENGINE_SANDBOX_CONFIG"] = str(conf)
    original = json.dumps({"filesystem": {"whitelist": white}})
    conf.write_text(original)
    hooks = home / ".config" / "autostart"
    loaded = load_sandbox_config(env=env)
    with SandboxRunner(loaded, engine=box["engine"], env=env) as r:
        cmd = REWRITE.replace("{conf}", str(conf)).replace("{hooks}", str(hooks))
        res = r.run(["bash", "-c", cmd], str(proj))
    assert conf.read_text() == original, res
    assert not (hooks / "evil.desktop").exists(), res
    assert "rewritten" not in res.stdout
    if how != "named-in-project":  # refused when read, with the reason
        assert loaded.problems
        assert any("login" in p.message or "configuration" in p.message
                   for p in loaded.problems), loaded.problems


@pytest.mark.parametrize("entry", ["/opt", "/srv", "/home", "/mnt", "/var/www", "/root"])
def test_shared_roots_are_never_whitelisted(box: dict[str, Any], entry: str) -> None:
    # as root, the first command would hand every root-owned file beneath them to the sandbox uid
    path = box["home"] / ".config" / "policy-engine" / "sandbox.json"
    path.write_text(json.dumps({"filesystem": {"whitelist": ["~/proj", entry]}}))
    loaded = load_sandbox_config(path, env=box["env"])
    assert [e.written for e in loaded.config.whitelist] == []  # strict defaults in force
    assert any(entry in p.message for p in loaded.problems), loaded.problems



def test_the_engines_code_and_python_are_never_whitelisted(box: dict[str, Any]) -> None:
    import policy_engine
    engine = os.path.dirname(os.path.abspath(policy_engine.__file__))
    for entry in (engine, os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)):
        path = box["home"] / ".config" / "policy-engine" / "sandbox.json"
        path.write_text(json.dumps({"filesystem": {"whitelist": ["~/proj", entry]}}))
        loaded = load_sandbox_config(path, env=box["env"])
        assert [e.written for e in loaded.config.whitelist] == [], entry
        assert any("engine's code" in p.message or "system tree" in p.message
                   for p in loaded.problems), loaded.problems


def test_a_shared_sticky_directory_is_refused_and_keeps_its_owner(box: dict[str, Any]) -> None:
    shared = box["tmp"] / "shared"
    (shared / "someone").mkdir(parents=True)
    (shared / "other-users-file").write_text("data")
    shared.chmod(0o1777)
    with _runner(box, {"filesystem": {"whitelist": []}}, box["env"]) as r:
        res = r.run(["touch", "x"], str(shared))
    assert res.code == "SANDBOX.CAPABILITY_BLOCKED", res
    for p in (shared, shared / "someone", shared / "other-users-file"):
        assert p.stat().st_uid == os.geteuid(), p
    assert not (shared / "x").exists()
