"""Plugin problems surface when the engine starts, once and clearly (issue 16 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from orchestrator_fixtures import ScriptedExecutor, orchestrator

from policy_engine.hookspecs import HOOK_API_VERSION, hookimpl
from policy_engine.model import OpKind
from policy_engine.plugin_manager import PluginManager

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def cli(*args: str, extra_path: Path | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def broken_distribution(where: Path) -> Path:
    """A real installed distribution (a .dist-info on sys.path) whose plugin cannot import."""
    info = where / "pe_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pe-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[policy_engine.plugins]\nbroken = pe_broken_mod\n")
    (where / "pe_broken_mod.py").write_text("import pe_no_such_module_anywhere\n")
    return where


def test_plugins_exits_non_zero_on_a_load_error_and_prints_it_once(tmp_path: Path) -> None:
    site = broken_distribution(tmp_path / "site")
    proc = cli("plugins", extra_path=site)
    assert proc.returncode == 1
    both = proc.stdout + proc.stderr
    assert both.count("pe_no_such_module_anywhere") == 1
    assert "error: plugin `broken` failed to import" in proc.stderr
    assert "executor proc-bwrap" in proc.stdout   # the others are still listed
    assert "Traceback" not in both
    # without it: exit 0 exactly when nothing failed to load (this machine's other installed
    # plugins decide which), and each remaining failure is one stderr line
    listing = json.loads(cli("plugins", "--format", "json").stdout)
    clean = cli("plugins")
    assert clean.returncode == (1 if listing["load_errors"] else 0), clean.stderr
    assert "broken" not in clean.stderr
    assert len(clean.stderr.splitlines()) == len(listing["load_errors"])


def test_json_listing_reports_load_errors_without_logging_them(tmp_path: Path) -> None:
    proc = cli("plugins", "--format", "json", extra_path=broken_distribution(tmp_path / "s"))
    assert proc.returncode == 1
    assert proc.stdout.count("pe_no_such_module_anywhere") == 1
    assert "pe_no_such_module_anywhere" not in proc.stderr


def test_a_misspelt_backend_is_refused_when_the_engine_starts(tmp_path: Path) -> None:
    class Closing(ScriptedExecutor):
        closed = False

        def close(self) -> None:
            self.closed = True

    tmp_exec = Closing("tmp-local", kinds=frozenset({OpKind.TMP_ALLOC}))
    with pytest.raises(ValueError, match=r"`tmp.alloc: tmp-locla` names no loaded executor; "
                                         r"did you mean `tmp-local`\?"):
        orchestrator(tmp_path, tmp_exec, backends={OpKind.TMP_ALLOC: "tmp-locla"})
    assert tmp_exec.closed


def _typo_config(tmp_path: Path) -> Path:
    config = tmp_path / "engine.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nbackends:\n  proc.exec: proc-bwarp\n")
    return config


def test_run_and_serve_refuse_a_misspelt_backend_before_any_call(tmp_path: Path) -> None:
    config = _typo_config(tmp_path)
    run = cli("run", "--policy", str(EXAMPLES / "policies" / "org.sbpolicy"),
              "--manifest", str(EXAMPLES / "manifests" / "shell.json"),
              "--grant", str(EXAMPLES / "grants" / "shell-agent.json"),
              "--config", str(config), "--", "git", "--version")
    serve = cli("serve", "--policy", str(EXAMPLES / "policies" / "org.sbpolicy"),
                "--config", str(config), "--port", "0")
    for proc in (run, serve):
        assert proc.returncode == 2, proc.stderr
        assert "`proc.exec: proc-bwarp` names no loaded executor; did you mean `proc-bwrap`?" \
            in proc.stderr
        assert "Traceback" not in proc.stderr
        assert "PROVIDER.UNAVAILABLE" not in proc.stdout + proc.stderr


def test_config_keys_and_op_kinds_get_a_suggestion(tmp_path: Path) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("state_dir: var\nbackends:\n  proc.exe: proc-bwrap\n")
    proc = cli("check", str(config))
    assert proc.returncode == 1
    assert "engine.yaml:3:3: SBP105 invalid config: `backends`: `proc.exe` is not an op " \
           "kind; did you mean `proc.exec`?" in proc.stdout
    config.write_text("state_dir: var\nbackends: {}\nmodee: strict\n")
    proc = cli("check", str(config))
    assert "engine.yaml:3:1: SBP105 invalid config: unknown configuration key `modee`; did " \
           "you mean `mode`?" in proc.stdout


class _Declaring:
    """A plugin object declaring the hook API it was written for."""

    def __init__(self, version: str) -> None:
        self.POLICY_ENGINE_HOOK_API = version

    @hookimpl
    def policy_engine_executors(self, config: object) -> list[object]:
        return []


def test_a_plugin_written_for_another_hook_api_major_is_refused_by_name() -> None:
    major, minor = HOOK_API_VERSION
    manager = PluginManager()
    assert manager.register(_Declaring(f"{major}.{minor}"), "same")
    assert manager.register(_Declaring(f"{major}.0"), "older-minor")
    assert not manager.register(_Declaring(f"{major + 1}.0"), "next-major")
    assert not manager.register(_Declaring(f"{major}.{minor + 1}"), "newer-minor")
    assert not manager.register(_Declaring("one"), "garbage")
    errors = {e.plugin: e.message for e in manager.load_errors}
    assert sorted(errors) == ["garbage", "newer-minor", "next-major"]
    assert "a different major version" in errors["next-major"]
    assert "upgrade policy-engine" in errors["newer-minor"]
    assert "is not a `MAJOR.MINOR` version" in errors["garbage"]
    assert sorted(manager.sources) == ["older-minor", "same"]


def test_check_finds_a_misspelt_backend_at_its_line(tmp_path: Path) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("state_dir: var\nbackends:\n  fs.read: fs\n  proc.exec: proc-bwarp\n")
    proc = cli("check", str(config))
    assert proc.returncode == 1
    assert "engine.yaml:4:3: SBP105 invalid config: `backends`: `proc.exec: proc-bwarp` names " \
           "no loaded executor; did you mean `proc-bwrap`?" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].endswith("1 error(s), 0 warning(s)")
    config.write_text("state_dir: var\nbackends:\n  proc.exec: proc-bwrap\n")
    assert cli("check", str(config)).returncode == 0


def test_a_default_backend_that_failed_to_load_is_never_replaced_by_another(
        tmp_path: Path) -> None:
    """The proc plugin fails to load (an option it refuses): `proc.exec` used to run on the
    next executor serving it (docker) without anyone choosing it. Now: PROVIDER.UNAVAILABLE
    naming the default backend, nothing runs."""
    (tmp_path / "engine.yaml").write_text(
        f"state_dir: {tmp_path / 'state'}\noptions:\n  proc: {{bwrap: bwrap}}\n")
    proc = cli("run", "--config", str(tmp_path / "engine.yaml"),
               "--policy", str(EXAMPLES / "policies/org.sbpolicy"),
               "--request", str(EXAMPLES / "requests/git-status.json"), "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert result["code"] == "PROVIDER.UNAVAILABLE", result
    assert "default backend `proc-bwrap`" in result["message"]
    assert result["used"]["calls"] == 0
    assert "docker" not in json.dumps(result)
    assert "`bwrap` must be an absolute path" in proc.stderr  # the load error, said once
    assert "Traceback" not in proc.stderr
