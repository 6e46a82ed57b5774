"""`policy-engine new-plugin`: the generated package installs and passes the conformance kit.

Each generated package is pip-installed with ``--target`` into a temporary directory (nothing
lands in this interpreter's site-packages) and checked in fresh interpreters whose
``PYTHONPATH`` adds that directory, as a plugin author would after ``pip install .``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.integration.pytest_child import WITHOUT_UNUSED

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run_argv(argv: list[str], cwd: Path, site: Path | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site) if site else "", env.get("PYTHONPATH", "")) if p)
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout, check=False)


def run(*args: str, cwd: Path, site: Path | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, *args], cwd=cwd, site=site, timeout=timeout)


def cli(*args: str, cwd: Path, site: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run("-m", "policy_engine.cli", *args, cwd=cwd, site=site)


def generate_and_install(tmp_path: Path, name: str, kind: str) -> tuple[Path, Path]:
    gen = cli("new-plugin", name, "--kind", kind, "--dir", "generated", cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    assert f"created {kind} plugin `{name}`" in gen.stdout
    site = tmp_path / "site"
    has_backend = all(importlib.util.find_spec(m) for m in ("setuptools", "wheel"))
    pip = run("-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps",
              *(["--no-build-isolation"] if has_backend else []),
              "--target", str(site), str(tmp_path / "generated"), cwd=tmp_path)
    assert pip.returncode == 0, pip.stderr
    return tmp_path / "generated", site


def test_generated_executor_installs_and_passes_the_kit(tmp_path: Path) -> None:
    name = "acme-reader"
    gen, site = generate_and_install(tmp_path, name, "executor")
    assert sorted(str(p.relative_to(gen)) for p in gen.rglob("*") if p.is_file()
                  and "build" not in p.parts and ".egg-info" not in str(p)) == [
        "README.md", "pe_acme_reader/__init__.py", "pe_acme_reader/plugin.py",
        "pyproject.toml", "tests/test_conformance.py"]
    project = tomllib.loads((gen / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["entry-points"]["policy_engine.plugins"] == {
        "acme_reader": "pe_acme_reader.plugin"}

    listed = cli("plugins", "--format", "json", cwd=tmp_path, site=site)
    info = json.loads(listed.stdout)
    ours = next(p for p in info["plugins"] if p["name"] == "acme_reader")
    assert ours["distribution"] == "pe-acme-reader"
    assert [e["name"] for e in ours["executors"]] == [name]
    # honest capabilities: fs.read only, network off, no isolation claimed
    caps = ours["executors"][0]["capabilities"]
    assert caps["op_kinds"] == ["fs.read"]
    assert caps["network_modes"] == ["off"]
    assert not any(v is True for v in caps.values())

    # exactly what a plugin author types: the installed console script
    script = shutil.which("policy-engine")
    assert script is not None, "the policy-engine console script is not on PATH"
    kit = run_argv([script, "conformance", "--executor", name, "--format", "json"],
                   cwd=tmp_path, site=site)
    assert kit.returncode == 0, kit.stdout + kit.stderr
    results = {r["id"]: r["status"] for r in json.loads(kit.stdout)["checks"]}
    assert "fail" not in results.values(), results
    for check in ("metadata.name", "metadata.capabilities", "capabilities.runs[fs.read]",
                  "capabilities.undeclared-not-routed", "refusal.wrong-kind",
                  "refusal.policy-denial", "refusal.registry-codes", "evidence.complete",
                  "evidence.no-secrets", "lifecycle.close"):
        assert results[check] == "pass", (check, results)
    # the rest does not apply to an in-process fs.read reader (no slow probe, no proc.exec)
    assert {k for k, v in results.items() if v == "n/a"} == {
        "timeout.honoured", "cancel.honoured", "limits.timeout", "compat.degraded-recorded",
        *(k for k in results if k.startswith("claims."))}

    # the package's own tests run the kit through `pytest --pe-executor NAME`
    tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", *WITHOUT_UNUSED, "tests",
                cwd=gen, site=site)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "2 passed" in tests.stdout


def test_generated_sink_installs_and_passes_the_sink_kit(tmp_path: Path) -> None:
    name = "acme-log"
    gen, site = generate_and_install(tmp_path, name, "sink")
    kit = cli("conformance", "--sink", name, "--format", "json", cwd=tmp_path, site=site)
    assert kit.returncode == 0, kit.stdout + kit.stderr
    results = {r["id"]: r["status"] for r in json.loads(kit.stdout)["checks"]}
    assert results == {"sink.readable": "pass", "sink.complete": "pass",
                       "sink.no-raw-content": "pass", "sink.durable": "pass"}
    tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", *WITHOUT_UNUSED, "tests",
                cwd=gen, site=site)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "2 passed" in tests.stdout


CONTEXT_SCRIPT = """
import json, os, sys, time
from pe_acme_reader.plugin import AcmeReaderExecutor
from policy_engine.errors import PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.model import FsReadOp, FsWriteOp, Limits
from tests.unit.test_executor_fs import make_profile

root, outside = sys.argv[1], sys.argv[2]
ex = AcmeReaderExecutor()

def call(op, deadline=30.0, cancel=False, **limits):
    profile = make_profile(__import__("pathlib").Path(root))
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + deadline,
                      limits=Limits(**limits) if limits else profile.limits)
    if cancel:
        ctx.cancel.cancel("caller went away")
    try:
        res = ex.execute(ctx, op)
        out = {"ok": res.ok, "size": res.out["size"], "effects": [e.meta for e in ctx.side_effects]}
    except PolicyEngineError as exc:
        out = {"code": exc.code.value}
    out["started"] = ctx.has_started
    return out

f = os.path.join(root, "data.txt")
print(json.dumps({
    "ok": call(FsReadOp(path=f)),
    "deadline": call(FsReadOp(path=f), deadline=-1),
    "cancel": call(FsReadOp(path=f), cancel=True),
    "ctx_limit": call(FsReadOp(path=f), max_bytes_in=4),
    "len_over": call(FsReadOp(path=f, len=8), max_bytes_in=4),
    "link_out": call(FsReadOp(path=os.path.join(root, "link"))),
    "dotdot": call(FsReadOp(path=os.path.join(root, "..", os.path.basename(outside)))),
    "wrong_kind": call(FsWriteOp(path=f, bytes_b64="eA==")),
}))
"""


def test_generated_executor_honours_its_context(tmp_path: Path) -> None:
    """Deadline, cancel, ctx.limits (not the profile's), ctx.started() only once it opens,
    the root as a second line, metadata-only side effects: called directly, not via the kit."""
    _gen, site = generate_and_install(tmp_path, "acme-reader", "executor")
    root = tmp_path / "root"
    root.mkdir()
    (root / "data.txt").write_text("ten bytes!", encoding="utf-8")
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours", encoding="utf-8")
    (root / "link").symlink_to(outside)
    env_site = os.pathsep.join((str(site), str(ROOT)))
    proc = run("-c", CONTEXT_SCRIPT, str(root), str(outside), cwd=tmp_path,
               site=Path(env_site))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["ok"] == {"ok": True, "size": 10, "started": True, "effects": [
        {"op": "fs.read", "path": str(root / "data.txt"), "bytes": 10}]}
    assert got["deadline"] == {"code": "LLM.TIMEOUT", "started": False}
    assert got["cancel"] == {"code": "TOOL.EXECUTION_FAILED", "started": False}
    assert got["ctx_limit"] == {"code": "SANDBOX.CAPABILITY_BLOCKED", "started": True}
    assert got["len_over"] == {"code": "SANDBOX.CAPABILITY_BLOCKED", "started": False}
    assert got["link_out"] == {"code": "SANDBOX.CAPABILITY_BLOCKED", "started": False}
    assert got["dotdot"] == {"code": "SANDBOX.CAPABILITY_BLOCKED", "started": False}
    assert got["wrong_kind"] == {"code": "TOOL.EXECUTION_FAILED", "started": False}


@pytest.mark.parametrize("name", ["Acme", "9lives", "acme_reader", "acme--reader", "acme-",
                                  "a" * 41, "../escape", "",
                                  "acme\nreader\x1b[31m"])
def test_invalid_name_is_refused_and_nothing_is_written(tmp_path: Path, name: str) -> None:
    proc = cli("new-plugin", name, "--dir", "out", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is not a valid plugin name" in proc.stderr
    assert len(proc.stderr.splitlines()) == 2  # error + help, escapes shown escaped
    assert "\x1b" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_first_party_name_is_refused(tmp_path: Path) -> None:
    proc = cli("new-plugin", "fs", cwd=tmp_path)
    assert proc.returncode == 2
    assert "`fs` is the name of a first-party plugin" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_non_empty_target_is_refused_and_left_untouched(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("mine\n", encoding="utf-8")
    proc = cli("new-plugin", "acme-reader", "--dir", str(target), cwd=tmp_path)
    assert proc.returncode == 2
    assert f"`{target}` already exists and is not an empty directory" in proc.stderr
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    proc = cli("new-plugin", "acme-reader", "--dir", "afile", cwd=tmp_path)
    assert proc.returncode == 2
    assert "already exists and is not an empty directory" in proc.stderr


def test_empty_target_and_default_directory_are_used(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert cli("new-plugin", "acme-reader", "--dir", "empty", cwd=tmp_path).returncode == 0
    assert (tmp_path / "empty" / "pe_acme_reader" / "plugin.py").is_file()
    assert cli("new-plugin", "acme-log", "--kind", "sink", cwd=tmp_path).returncode == 0
    assert (tmp_path / "pe-acme-log" / "pe_acme_log" / "plugin.py").is_file()


def test_every_template_ships_as_package_data() -> None:
    """The wheel carries a file only when a package-data glob names it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = project["tool"]["setuptools"]["package-data"]["policy_engine"]
    pkg = ROOT / "policy_engine"
    shipped = {p for g in globs for p in pkg.glob(g)}
    templates = {p for p in (pkg / "templates").rglob("*") if p.is_file()
                 and "__pycache__" not in p.parts}
    assert templates, "no templates found"
    assert templates <= shipped, sorted(str(p) for p in templates - shipped)


@pytest.mark.parametrize(("argv", "line"), [
    ([], "pip install -e ./pe-acme-net && "),
    (["--dir", "sub/x"], "pip install -e ./sub/x && "),
    (["--dir", "../outer"], "pip install -e ../outer && "),
])
def test_the_printed_install_line_names_the_local_folder(
        tmp_path: Path, argv: list[str], line: str) -> None:
    """A bare `pip install pe-acme-net` would ask the package index for that name (a
    dependency-confusion trap): the line names the folder as a path."""
    (tmp_path / "cwd").mkdir()
    # this checkout's engine, whatever the cwd (the others here only need an installed one)
    gen = cli("new-plugin", "acme-net", *argv, cwd=tmp_path / "cwd", site=ROOT)
    assert gen.returncode == 0, gen.stderr
    nxt = next(x for x in gen.stdout.splitlines() if x.startswith("next: "))
    assert nxt.startswith("next: " + line), nxt
    assert nxt.endswith("policy-engine conformance --executor acme-net"), nxt
    folder = nxt.removeprefix("next: pip install -e ").split(" && ")[0]
    assert ((tmp_path / "cwd" / folder) / "pyproject.toml").is_file()
