"""Masks that follow inodes and symlinks and cover the system binds, run for real through
proc-bwrap (outsider attack round 3: F1 hard links, F9 system binds, F5/F10 symlinks, F6 exec)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.executor_proc.executor import ProcExecutor, ProcOptions
from policy_engine.config import EngineConfig
from policy_engine.executor import ExecContext
from policy_engine.model import ProcExecOp
from policy_engine.sandbox_config.sbconfig import load_sandbox_config
from policy_engine.sandbox_runner.runner import SandboxRunner
from tests.integration.test_proc_sandbox import make_profile

pytestmark = pytest.mark.integration

SSH, AWS, ENV = "MARKER_SSH_7f3a", "MARKER_AWS_91bc", "MARKER_ENV_c0ff"
REAL_CACHE = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


@pytest.fixture
def box() -> Iterator[dict[str, Any]]:
    # outside /tmp (every sandbox has its own), world-readable: only the sandbox's own masks
    # keep the secrets out (the sandbox uid is not their owner under a root engine)
    top = Path(tempfile.mkdtemp(prefix="pe-r3-", dir="/var/tmp"))
    home = top / "home"
    for d in (".ssh", ".aws", "proj", ".config/policy-engine"):
        (home / d).mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SSH)
    (home / ".aws" / "credentials").write_text(f"[default]\nkey={AWS}\n")
    (home / ".netrc").write_text("machine x password MARKER_NETRC\n")
    (home / "proj" / ".env").write_text(f"SECRET={ENV}\n")
    for p in [top, *top.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "XDG_CACHE_HOME": REAL_CACHE}
    try:
        yield {"top": top, "home": home, "proj": home / "proj", "env": env,
               "engine": EngineConfig(state_dir=top / "state", budget_meter="memory")}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def runner(box: dict[str, Any], fs: dict[str, Any], **env: str) -> SandboxRunner:
    full = {**box["env"], **env}
    path = Path(full["HOME"]) / ".config" / "policy-engine" / "sandbox.json"
    path.write_text(json.dumps({"filesystem": fs}))
    return SandboxRunner(load_sandbox_config(path, env=full), engine=box["engine"], env=full)


@pytest.mark.parametrize("read_outside", [False, True])
def test_hard_links_to_secrets_are_masked(box: dict[str, Any], read_outside: bool) -> None:
    home, proj = box["home"], box["proj"]
    os.link(home / ".ssh" / "id_rsa", proj / "notes.txt")
    os.link(home / ".aws" / "credentials", proj / "aws.txt")
    os.link(proj / ".env", proj / "env-copy")
    (proj / "plain.txt").write_text("PLAIN")
    fs = {"whitelist": ["~/proj"], "allowReadOutside": read_outside}
    with runner(box, fs) as r:
        res = r.run(["bash", "-c", "cat plain.txt notes.txt aws.txt env-copy"], str(proj))
    assert "PLAIN" in res.stdout, res
    for marker in (SSH, AWS, ENV):
        assert marker not in res.stdout + res.stderr, res


def test_blacklist_globs_cover_the_system_binds(box: dict[str, Any]) -> None:
    proj = box["proj"]
    (proj / "in-proj.pem").write_text("MARKER_PEM")
    key = Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "test",
               "certdata", "keycertecc.pem")
    pem = sorted(Path("/etc/ssl/certs").glob("*.pem"))
    probes = [str(p) for p in (key, *pem[:1]) if p.exists()]
    assert probes, "no PEM file on this host to probe with"
    start = time.monotonic()
    with runner(box, {"whitelist": ["~/proj"], "blacklist": ["**/*.pem"]}) as r:
        res = r.run(["bash", "-c", "cat in-proj.pem " + " ".join(probes) + "; echo ran"],
                    str(proj))
        first = time.monotonic() - start
        again = time.monotonic()
        r.run(["true"], str(proj))
        warm = time.monotonic() - again
    assert res.stdout.rstrip().endswith("ran"), res
    assert "MARKER_PEM" not in res.stdout
    assert "BEGIN" not in res.stdout, res.stdout[:300]
    print(f"first command {first:.2f} s, next {warm:.2f} s")


def test_a_planted_symlink_at_a_blacklisted_name_bricks_nothing(box: dict[str, Any]) -> None:
    proj = box["proj"]
    with runner(box, {"whitelist": ["~/proj"]}) as r:
        plant = r.run(["bash", "-c", "ln -s /etc/hostname secrets.json && echo planted"],
                      str(proj))
        assert "planted" in plant.stdout, plant
        preview = r.preview(["echo", "hi"], str(proj))
        res = r.run(["echo", "hi"], str(proj))
    assert preview["decision"] == "allow"
    assert (res.exit_code, res.stdout.strip()) == (0, "hi"), res


def test_docs_pem_example_with_read_outside_runs(box: dict[str, Any]) -> None:
    fs = {"whitelist": ["~/proj"], "allowReadOutside": True, "blacklist": ["**/*.pem"]}
    pem = sorted(Path("/etc/ssl/certs").glob("*.pem"))[:1]
    with runner(box, fs) as r:
        res = r.run(["bash", "-c", f"cat {' '.join(map(str, pem))} /etc/hostname; echo ran"],
                    str(box["proj"]))
    assert res.stdout.rstrip().endswith("ran"), res
    assert "BEGIN" not in res.stdout


def test_symlinked_home_with_read_outside_runs_and_masks(box: dict[str, Any]) -> None:
    link = box["top"] / "homelink"
    link.symlink_to(box["home"])
    fs = {"whitelist": ["~/proj"], "allowReadOutside": True}
    with runner(box, fs, HOME=str(link)) as r:
        preview = r.preview(["true"], str(box["proj"]))
        res = r.run(["bash", "-c", f"cat {link}/.ssh/id_rsa {link}/.netrc "
                     f"{box['home']}/.ssh/id_rsa; echo ran"], str(box["proj"]))
    assert preview["decision"] == "allow"
    assert res.stdout.rstrip().endswith("ran"), res
    assert SSH not in res.stdout
    assert "MARKER_NETRC" not in res.stdout


def test_scripts_in_the_whitelist_can_be_executed(box: dict[str, Any]) -> None:
    proj = box["proj"]
    script = proj / "s.sh"
    script.write_text("#!/bin/sh\necho script-ran\n")
    script.chmod(0o755)
    with runner(box, {"whitelist": ["~/proj"]}) as r:
        direct = r.run([str(script)], str(proj))
        shell = r.run(["bash", "-c", "./s.sh"], str(proj))
    assert direct.stdout.strip() == "script-ran", direct
    assert shell.stdout.strip() == "script-ran", shell


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "unshare"])
def test_hard_links_are_masked_on_every_proc_backend(tmp_path: Path, backend: str) -> None:
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    (root / "home" / ".ssh").mkdir(parents=True)
    (root / "home" / ".ssh" / "id_rsa").write_text(SSH)
    os.link(root / "home" / ".ssh" / "id_rsa", root / "out" / "notes.txt")
    (root / "out" / "plain.txt").write_text("PLAIN")
    for p in [tmp_path, *tmp_path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    ex = ProcExecutor(backend, ProcOptions(prespawn=0))
    try:
        assert ex.available() is True, ex.unavailable_reason
        ctx = ExecContext(profile=make_profile(root), deadline=time.monotonic() + 60)
        res = ex.execute(ctx, ProcExecOp(tool="/bin/cat", args=("plain.txt", "notes.txt"),
                                         cwd=str(root / "out")))
    finally:
        ex.close()
    out = str(res.out.get("stdout", ""))
    assert "PLAIN" in out, res
    assert SSH not in out + str(res.out.get("stderr", "")), res


def test_a_masked_name_that_is_not_utf8_breaks_nothing(box: dict[str, Any]) -> None:
    """A host file whose name is not UTF-8 (here `k\\xff.pem`) matching a blacklist glob is
    masked, and the run's result and evidence name it with an escape instead of failing (a
    planted name crashed every sandbox run in the evidence digest)."""
    proj = box["proj"]
    raw = os.path.join(os.fsencode(str(proj)), b"k\xff.pem")
    with open(raw, "wb") as fh:
        fh.write(b"MARKER_PEM_NOT_UTF8\n")
    os.chmod(raw, 0o644)
    fs = {"whitelist": ["~/proj"], "allowReadOutside": True, "blacklist": ["**/*.pem"]}
    with runner(box, fs) as r:
        res = r.run(["bash", "-c", "cat ./k*.pem; echo ran"], str(proj))
    assert res.stdout.rstrip().endswith("ran"), res
    assert "MARKER_PEM_NOT_UTF8" not in res.stdout
    assert res.extra["masked"] >= 1
    json.dumps(res.to_json(), ensure_ascii=False).encode("utf-8")  # printable as it is
    records = [json.loads(line) for line in
               (box["top"] / "state" / "evidence" / "evidence.jsonl").read_text().splitlines()]
    records = [r for r in records if r["type"] != "checkpoint"]  # signed at close by default
    assert records[-1]["type"] == "end"
    assert records[-1]["status"] == "ok", records[-1]


def test_printable_path_escapes_what_is_not_utf8() -> None:
    from policy_engine.model.text import printable_path

    assert printable_path(os.fsdecode(b"/p/k\xff.pem")) == "/p/k\\xff.pem"
    assert printable_path("/p/\u00e9") == "/p/\u00e9"
    assert printable_path("/p/\ud800") == "/p/\\xed\\xa0\\x80"
