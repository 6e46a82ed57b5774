"""Plugins load without their SDKs (issue 30 item 7): a `check` or a `run` of a tmp op imports
no Playwright, docker SDK, Redis or PostgreSQL client, nor httpx; each is imported by the first
call that needs it, and a plugin whose optional package is missing is still reported as not
installed when the plugins load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.lazy import LazyModule, lazy_module

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "examples" / "policies" / "org.sbpolicy"
TMP_REQUEST = ROOT / "examples" / "requests" / "tmp-alloc-small.json"
HEAVY = ("playwright", "docker", "redis", "psycopg", "httpx", "httpcore", "trio", "requests")


def _child(code: str, *argv: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POLICY_ENGINE_FAST_EXIT": "0",
           "PE_HEAVY": json.dumps(HEAVY)}
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120, check=False)
    assert done.stdout.strip(), done.stderr[-2000:]
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


_CLI = """
import json, os, sys
sys.argv = ["policy-engine", *sys.argv[1:]]
from policy_engine.cli.main import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = json.loads(os.environ["PE_HEAVY"])
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules
                  if m.split(".")[0] in heavy)}))
"""


@pytest.mark.parametrize("argv", [
    ("check", str(POLICY)),
    ("run", "--policy", str(POLICY), "--request", str(TMP_REQUEST), "--format", "json"),
    ("explain", "--policy", str(POLICY), "--request", str(TMP_REQUEST)),
], ids=["check", "run-tmp-alloc", "explain-tmp-alloc"])
def test_a_cli_start_imports_no_plugin_sdk(argv: tuple[str, ...], tmp_path: Path) -> None:
    if argv[0] == "run":
        argv = (*argv, "--state-dir", str(tmp_path / "state"))
    got = _child(_CLI, *argv)
    assert got["code"] in (0, None), got
    assert got["loaded"] == [], f"`{argv[0]}` imported {got['loaded']}"


def test_every_executor_is_built_without_its_sdk_and_imports_it_on_first_use() -> None:
    code = """
import json, os, sys
from pathlib import Path
import tempfile
from policy_engine.config import EngineConfig
from policy_engine.plugin_manager import PluginManager
with tempfile.TemporaryDirectory() as state:
    comps = PluginManager.default().components(EngineConfig(state_dir=Path(state)))
    names = sorted(comps.executors)
    before = sorted(m for m in sys.modules if m.split(".")[0] in json.loads(os.environ["PE_HEAVY"]))
    from plugins.executor_docker import engine
    hard = engine.Hardening(network_mode="none", pids_limit=8, mem_limit=1 << 28,
                            nano_cpus=10**9).create_kwargs()
    comps.close()
print(json.dumps({"executors": names, "before": before,
                  "ulimit": type(hard["ulimits"][0]).__module__,
                  "after": "docker" in sys.modules}))
"""
    got = _child(code)
    executors = got["executors"]
    assert isinstance(executors, list)
    assert {"browser", "docker", "http"} <= set(executors)
    assert got["before"] == []
    # the first use of the SDK imports it, by the name the code uses
    assert got["ulimit"] == "docker.types.containers"
    assert got["after"] is True


def test_a_missing_optional_package_is_still_reported_as_not_installed() -> None:
    # `sys.modules[name] = None` is how a blocked import looks to `import` itself
    code = """
import json, sys
sys.modules["redis"] = None
sys.modules["psycopg"] = None
from policy_engine.plugin_manager import PluginManager
m = PluginManager.default()
print(json.dumps({"missing": sorted((n.plugin, n.module, n.extra) for n in m.not_installed),
                  "errors": [e.to_json() for e in m.load_errors]}))
"""
    got = _child(code)
    assert got["missing"] == [["budget_redis", "redis", "scale"],
                              ["evidence_postgres", "psycopg", "scale"]]
    assert got["errors"] == []


def test_lazy_module_imports_on_first_attribute_only() -> None:
    name = "json.tool"  # stdlib, not imported by pytest or this suite's imports
    sys.modules.pop(name, None)
    lazy = lazy_module(name)
    assert isinstance(lazy, LazyModule)
    assert name not in sys.modules
    # introspection asks for dunders: answered without importing
    assert not hasattr(lazy, "__wrapped__")
    assert name not in sys.modules
    assert callable(lazy.main)
    assert name in sys.modules
    assert "(imported)" in repr(lazy)


def test_lazy_module_names_submodules_and_refuses_unknown_names() -> None:
    sys.modules.pop("email.mime.text", None)
    mime = lazy_module("email.mime")
    assert mime.text.MIMEText.__name__ == "MIMEText"  # a submodule the package never imports
    assert not hasattr(mime, "no_such_part_here")
    with pytest.raises(AttributeError, match="no_such_part_here"):
        _ = mime.no_such_part_here


def test_required_lazy_module_raises_as_import_would() -> None:
    with pytest.raises(ModuleNotFoundError) as exc:
        lazy_module("pe_no_such_distribution_at_all.sub", required=True)
    assert exc.value.name == "pe_no_such_distribution_at_all"
    assert lazy_module("json", required=True).dumps([1]) == "[1]"
