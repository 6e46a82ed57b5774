"""The stored mask walk across a restart, proved in the real sandbox: a secret planted deep in
/usr while the engine was stopped is masked by the first call after the restart (issue 27
item 4: the stored walk is revalidated, never trusted as it was).

The secret's name (`.pe-listing-secret`) is denied by this test's profile alone: a `.env`
planted in the host's /usr changed the masks of every sandbox of every test running meanwhile
(a docker session's container re-made, a live interpreter restarted under another test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from policy_engine.sandbox.masks import RACY_NS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# one engine run in a fresh process: a proc-bwrap executor, its first call issued at once (it
# waits for the start's revalidation), `cat` of the planted path and of a control file beside it
# (an unmasked name, so the test shows the sandbox could read the directory)
RUN = """
import json, sys, time
from pathlib import Path
from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.model import CapabilityKind, FsCapability, ProcExecOp, ProfileDeny, RuleRef
from policy_engine.sandbox import masks
from tests.integration.test_proc_sandbox import make_profile
root, target = Path(sys.argv[1]), sys.argv[2]
ex = ProcExecutor("bwrap")
profile = make_profile(root)
mine = ProfileDeny(kinds=(CapabilityKind.FS_READ,), mandatory=True,
                   capability=FsCapability(kind="fs.read", paths=("**/.pe-listing-secret",)),
                   rule=RuleRef(id="listing-secret", file="test", line=1, column=1))
profile = profile.model_copy(update={"denies": (*profile.denies, mine)})
ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60)
res = ex.execute(ctx, ProcExecOp(tool="/bin/sh", args=("-c", f"cat {target}.ctl; cat {target}")))
ex.close()
print(json.dumps({"exit": res.out.get("exit_code"), "stdout": res.out.get("stdout"),
                  "listed": masks.DEFAULT_CACHE.entries_listed}))
"""


def engine_run(root: Path, state: Path, target: str) -> dict[str, object]:
    env = {**os.environ, "POLICY_ENGINE_STATE": str(state)}
    env.pop("POLICY_ENGINE_LISTING_CACHE", None)
    done = subprocess.run([sys.executable, "-c", RUN, str(root), target], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True, timeout=300)
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def deep_usr_dir() -> Path:
    """A directory four levels into /usr/share (first names in order), long unchanged."""
    d = Path("/usr/share")
    for _ in range(3):
        kids = sorted(e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False))
        if not kids:
            break
        d = Path(kids[0])
    assert len(d.parts) >= 4, d
    return d


def test_a_secret_planted_in_usr_while_stopped_is_masked_on_the_first_call(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "home").mkdir(parents=True)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    where = deep_usr_dir()
    planted = where / f".pe-listing-secret.new-{uuid.uuid4().hex[:8]}"
    secret, control = where / ".pe-listing-secret", where / ".pe-listing-secret.ctl"
    assert not secret.exists()
    assert not control.exists()
    first = engine_run(root, state, str(secret))
    assert first["exit"] != 0  # nothing there yet: cat fails
    assert any(state.rglob("mask-*")), "the first run stored its walk"
    token = f"TOKEN={uuid.uuid4().hex}"
    try:
        # written under a private name, then renamed: the directory's ctime moves once
        planted.write_text(token)
        os.rename(planted, secret)
        control.write_text(f"control {token}")
        time.sleep(RACY_NS / 1e9 + 0.2)  # older than the racy window: a stale stamp would match
        again = engine_run(root, state, str(secret))
        out = str(again["stdout"])
        assert f"control {token}" in out  # the directory is readable in the sandbox
        assert out.count(token) == 1  # and the `.env` beside it is masked
        # the restart revalidated the stored walk instead of walking /usr again
        assert isinstance(again["listed"], int)
        assert again["listed"] < 5_000
    finally:
        for p in (planted, secret, control):
            if p.exists():
                p.unlink()
