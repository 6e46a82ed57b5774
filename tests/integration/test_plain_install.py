"""A plain install is quiet: the wheel built here, installed in a fresh virtualenv with its base
dependencies only (no `scale` extra, so neither `redis` nor `psycopg`), lists the Redis and
PostgreSQL plugins as "available with pip install 'policy-engine[scale]'" and exits 0, and
`run`, the Python API, `serve` and `mcp` start without a word about them.

The virtualenv has no system site-packages: the base dependencies come from the local wheelhouse
`scripts/test.sh` downloads before the suite (``PE_WHEELHOUSE``; installed with ``--no-index``,
so the test reaches no registry), or, run without it, from the registries pip is configured with
(the `serve`/`mcp` faces' extras are added for the last checks, still without `scale`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from tests.integration.project_wheel import project_wheel

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("budget_redis", "evidence_postgres", "redis", "psycopg", "failed to import")
WHEELHOUSE = os.environ.get("PE_WHEELHOUSE")
LOCAL = ["--no-index", "--find-links", WHEELHOUSE] if WHEELHOUSE else []
"""pip's source: the wheelhouse when the test command made one (never a registry then)."""


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("plain")
    wheel = project_wheel(tmp_path_factory)
    # no pip of its own: this interpreter's pip installs into it (``--python``), which spares
    # ensurepip (seconds) and changes nothing the checks look at
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(work / "venv")
    subprocess.run([*pip_into(work / "venv"), "--no-deps", str(wheel)], check=True, timeout=600)
    # the base dependencies exactly as the wheel declares them (markers without `extra`)
    meta = subprocess.run(
        [str(work / "venv" / "bin" / "python"), "-c",
         "from importlib.metadata import requires\n"
         "print('\\n'.join(r for r in requires('policy-engine') if 'extra ==' not in r))"],
        capture_output=True, text=True, check=True)
    subprocess.run([*pip_into(work / "venv"), *meta.stdout.split("\n")[:-1]], check=True,
                   timeout=900)
    return {"bin": work / "venv" / "bin", "wheel": wheel, "work": work}


def pip_into(env: Path) -> list[str]:
    """``pip install`` into the virtualenv ``env`` (from the wheelhouse when there is one)."""
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python",
            str(env / "bin" / "python"), "install", "-q", *LOCAL]


def _env() -> dict[str, str]:
    # only the venv's installation: no checkout on the path
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _quiet(text: str) -> None:
    for word in NOISE:
        assert word not in text, text


def test_plain_install_lists_optional_plugins_and_stays_quiet(
        plain: dict[str, Path], tmp_path: Path) -> None:
    python = plain["bin"] / "python"
    absent = subprocess.run([str(python), "-c", "import redis"], capture_output=True, env=_env())
    assert absent.returncode != 0  # the point of the test: the extra really is missing
    listing = subprocess.run([str(plain["bin"] / "policy-engine"), "plugins"],
                             capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert listing.stderr == ""
    lines = listing.stdout.splitlines()
    for plugin, module in (("budget_redis", "redis"), ("evidence_postgres", "psycopg")):
        line = next(x for x in lines if x.startswith(plugin + " "))
        assert f"needs `{module}`" in line
        assert line.endswith("available with `pip install 'policy-engine[scale]'`")

    policy = ROOT / "examples" / "policies" / "org.sbpolicy"
    request = ROOT / "examples" / "requests" / "tmp-alloc-small.json"
    ran = subprocess.run([str(plain["bin"] / "policy-engine"), "run", "--policy", str(policy),
                          "--request", str(request), "--state-dir", str(tmp_path / "state")],
                         capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "decision: allow" in ran.stdout
    _quiet(ran.stderr)

    # the faces whose extra is missing say which, in one line, without a traceback
    for argv, extra in ((["serve", "--policy", str(policy)], "serve"),
                        (["tokens", "list", "--state-dir", str(tmp_path / "t")], "serve"),
                        (["mcp", "--policy", str(policy), "--tenant", "t", "--subject", "s"],
                         "mcp"),
                        (["lsp"], "lsp")):
        face = subprocess.run([str(plain["bin"] / "policy-engine"), *argv], input="",
                              capture_output=True, text=True, env=_env(), cwd=tmp_path,
                              timeout=120)
        assert face.returncode == 2, (argv, face.stderr)
        assert face.stderr.strip().endswith(f"pip install 'policy-engine[{extra}]'"), face.stderr

    # a configuration that asks for the missing plugin's meter says how to install it
    config = tmp_path / "redis.yaml"
    config.write_text("budget_meter: redis\n")
    asked = subprocess.run([str(plain["bin"] / "policy-engine"), "run", "--policy", str(policy),
                            "--request", str(request), "--config", str(config),
                            "--state-dir", str(tmp_path / "state2")],
                           capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert asked.returncode == 2, asked.stderr
    assert "budget meter `redis`" in asked.stderr
    assert "plugin `budget_redis` is available with `pip install 'policy-engine[scale]'`" in (
        asked.stderr)
    assert "Traceback" not in asked.stderr

    api = subprocess.run([str(python), "-c", (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"  # an embedder that shows its logs
        "from pathlib import Path\n"
        "from policy_engine import EngineConfig, Orchestrator, compile_files\n"
        f"ps = compile_files([{str(policy)!r}])\n"
        f"o = Orchestrator(ps, config=EngineConfig(state_dir=Path({str(tmp_path / 'api')!r})))\n"
        "print('meter', o.meter.name)\n"
        "o.close()\n")], capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert api.returncode == 0, api.stderr
    assert api.stdout.startswith("meter ")
    _quiet(api.stderr)


def test_serve_and_mcp_start_quietly_without_the_scale_extra(
        plain: dict[str, Path], tmp_path: Path) -> None:
    python = plain["bin"] / "python"
    subprocess.run([*pip_into(plain["bin"].parent), f"{plain['wheel']}[serve,mcp]"],
                   check=True, timeout=900, env=_env())
    assert subprocess.run([str(python), "-c", "import psycopg"], env=_env(),
                          capture_output=True).returncode != 0
    policy = ROOT / "examples" / "policies" / "org.sbpolicy"
    serve = subprocess.Popen(
        [str(plain["bin"] / "policy-engine"), "serve", "--policy", str(policy), "--port", "0",
         "--state-dir", str(tmp_path / "serve")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    try:
        assert serve.stderr is not None
        # printed once the engine is built and the port bound (after the one-time notice that
        # the evidence signing key was created, docs/operations.md)
        first = ""
        for _ in range(5):
            first += serve.stderr.readline()
            if "listening on http://" in first:
                break
        assert "listening on http://" in first, first
        time.sleep(0.5)  # anything logged right after start-up would be here too
    finally:
        serve.terminate()
        _out, rest = serve.communicate(timeout=30)
    _quiet(first + rest)

    mcp = subprocess.run(
        [str(plain["bin"] / "policy-engine"), "mcp", "--policy", str(policy), "--skills",
         str(tmp_path), "--tenant", "t", "--subject", "s", "--state-dir", str(tmp_path / "mcp")],
        input="", capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert "Traceback" not in mcp.stderr
    _quiet(mcp.stderr)
