"""`sandbox profile` with `allowReadOutside: true` does not walk the host (issue 32 item 11:
3 s, 266 MB, and the printed argv named every `.env` on the host, other users' included),
and the run still masks every secret: a planted tree outside the project is never listed by
the preview, its `.env` is not named, and `sandbox exec` cannot read it."""

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

from policy_engine.sandbox import masks
from policy_engine.sandbox_config.sbconfig import load_sandbox_config
from policy_engine.sandbox_runner.runner import SandboxRunner

pytestmark = pytest.mark.integration

SECRET = "PLANTED-OUTSIDE-SECRET-4711"


@pytest.fixture
def outside() -> Iterator[Path]:
    """A host tree outside the project (not /tmp: the sandbox's /tmp is private): 2,000
    directories and, deep inside, a `.env`."""
    d = Path(tempfile.mkdtemp(prefix="pe-profile-outside-", dir="/var/tmp"))
    d.chmod(0o755)
    for i in range(40):
        for j in range(50):
            (d / f"a{i}" / f"b{j}").mkdir(parents=True)
    secret = d / "a7" / "b3" / ".env"
    secret.write_text(f"TOKEN={SECRET}\n")
    secret.chmod(0o644)  # readable by anyone on the host: only the mask keeps it out
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _config(tmp_path: Path) -> tuple[Path, Path]:
    proj = tmp_path / "home" / "proj"
    proj.mkdir(parents=True)
    config = tmp_path / "sandbox.json"
    config.write_text(json.dumps({"enabled": True, "filesystem": {
        "whitelist": [str(proj)], "allowReadOutside": True}}))
    return config, proj


def test_the_preview_lists_nothing_outside_and_names_no_host_secret(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, proj = _config(tmp_path)
    listed: list[str] = []
    real_scandir = os.scandir

    def counting(path: Any = ".") -> Any:
        if str(path).startswith(str(outside)):
            listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(masks.os, "scandir", counting)
    masks.DEFAULT_CACHE.forget()  # a cold plan, as a fresh `sandbox profile` process makes
    from policy_engine.config import EngineConfig

    runner = SandboxRunner(load_sandbox_config(config), warn=False,
                           engine=EngineConfig(state_dir=tmp_path / "st"))
    data = runner.preview(["ls"], str(proj))
    assert data["decision"] == "allow", data
    assert "argv" in data, data
    assert listed == []  # before: every directory of the planted tree was listed
    argv = " ".join(data["argv"])
    assert str(outside) not in argv  # before: its .env was named in a /dev/null bind
    assert "/**/.env" in data["masked_at_run"]
    # literal mandatory denies are still in the argv, planned without a walk
    assert "/etc/shadow" in argv


def test_the_run_masks_what_the_preview_left_to_it(tmp_path: Path, outside: Path) -> None:
    config, proj = _config(tmp_path)
    env = {**os.environ, "HOME": str(tmp_path / "home"),
           "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")}
    cli = [sys.executable, "-m", "policy_engine.cli", "sandbox"]
    common = ["--config", str(config), "--state-dir", str(tmp_path / "st")]
    shown = subprocess.run([*cli, "profile", *common, "--cwd", str(proj), "--format", "json",
                            "--", "cat"], capture_output=True, text=True, timeout=120,
                           check=False, env=env)
    assert shown.returncode == 0, shown.stderr
    assert str(outside) not in shown.stdout
    ran = subprocess.run([*cli, "exec", *common, "--cwd", str(proj), "--", "/bin/cat",
                          str(outside / "a7" / "b3" / ".env")], capture_output=True, text=True,
                         timeout=120, check=False, env=env)
    assert SECRET not in ran.stdout + ran.stderr
    assert ran.returncode != 0, ran.stdout  # the mask is an empty file bind or refused
    readable = subprocess.run([*cli, "exec", *common, "--cwd", str(proj), "--", "/bin/ls",
                               str(outside / "a7")], capture_output=True, text=True,
                              timeout=120, check=False, env=env)
    assert "b3" in readable.stdout, readable.stdout + readable.stderr  # the rest is readable
