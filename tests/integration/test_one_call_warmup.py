"""A one-call CLI command does not walk the system trees ahead (``EngineConfig.warm_ahead``:
≈ 0.3 s of CPU per `run` that starts no process), and a call that needs the walk still gets
every mask a warmed engine gives it.

Each check runs in a fresh interpreter: the walk is process-wide, and a pytest worker has
usually started it long before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# the CLI, reporting on stderr at exit whether a warm-up thread was started in the process
CLI = ("import atexit, sys\n"
       "from plugins.executor_proc import bwrap, spec\n"
       "atexit.register(lambda: print('WARM-UPS', len(spec._warming), len(bwrap._PASSED),\n"
       "                              file=sys.stderr))\n"
       "from policy_engine.cli.main import main\n"
       "main()\n")
# reads what a mandatory deny hides (and the Python prefix, which stays readable); one line,
# as the policy's `-c` argument pattern takes
READER = ("import os, sys\n"
          "for name, p in (('shadow', '/etc/shadow'), ('gshadow', '/etc/gshadow'),\n"
          "                ('prefix', os.path.join(sys.base_prefix, 'lib'))):\n"
          "    try:\n"
          "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1)\n"
          "        print(name, 'readable')\n"
          "    except OSError as e:\n"
          "        print(name, type(e).__name__)\n")
READER = f"exec({READER!r})"
# the same call through the Python API, its executors warmed ahead (the default) and the
# warm-up awaited: the masks a serving engine plans
EAGER = """
import json, sys
from pathlib import Path
from plugins.executor_proc import spec
from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.model import Grant, Manifest, ProcExecOp, Settings
from policy_engine.orchestrator import Orchestrator
tmp, reader = Path(sys.argv[1]), sys.argv[2]
config = EngineConfig(state_dir=tmp / "eager-state", revocation="memory")
with Orchestrator(compile_files([tmp / "p.sbpolicy"]), config=config) as orch:
    assert spec._warming, "the Python API warms ahead"
    spec.prewarm(wait=True)
    out = orch.run(Grant.model_validate_json((tmp / "grant.json").read_text()),
                   Manifest.model_validate_json((tmp / "manifest.json").read_text()),
                   ProcExecOp(tool="python3", args=("-c", reader)),
                   settings=Settings(root_fs=str(tmp / "ws")))
print(json.dumps({"ok": out.result.ok, "code": out.result.code, "out": out.result.out}))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _files(tmp: Path) -> None:
    (tmp / "ws").mkdir()
    (tmp / "p.sbpolicy").write_text(
        'policy "t/warm" version "1.0.0"\n'
        "defaults { timeout 30s }\n"
        'permit "py" proc.exec tool "python3" args ["-c", /.*/]\n'
        'permit "scratch" tmp.use max_bytes 1MiB\n'
        "require consent when `false`\n")
    perms = [{"kind": "proc.exec", "tool": "python3"},
             {"kind": "tmp.use", "max_bytes": 1 << 20}]
    (tmp / "manifest.json").write_text(json.dumps({
        "name": "w", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Process"], "safety_class": "Low"}))
    (tmp / "grant.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:w", "tool_name": "w", "call_id": "c-w",
        "capabilities": perms, "expires_at": 4_102_444_800_000}))


def _cli(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int, int]:
    """The command's result, the warm-up threads it started and the bwrap trials it passed."""
    done = subprocess.run(
        [sys.executable, "-c", CLI, *args], cwd=tmp / "ws", env=_env(), capture_output=True,
        text=True, timeout=120, check=False)
    counts = [line.split()[1:] for line in done.stderr.splitlines()
              if line.startswith("WARM-UPS ")]
    assert len(counts) == 1, done.stderr[-2000:]
    return done, int(counts[0][0]), int(counts[0][1])


def _run_args(tmp: Path, state: str) -> list[str]:
    return ["run", "--policy", str(tmp / "p.sbpolicy"), "--manifest", str(tmp / "manifest.json"),
            "--grant", str(tmp / "grant.json"), "--state-dir", str(tmp / state),
            "--format", "json"]


def test_a_run_that_starts_no_process_walks_nothing(tmp_path: Path) -> None:
    _files(tmp_path)
    request = tmp_path / "req.json"
    request.write_text(json.dumps({
        "op": {"kind": "tmp.alloc", "size_bytes": 4096}, "manifest": "manifest.json",
        "grant": "grant.json"}))
    done, warmups, trials = _cli(tmp_path, "run", "--policy", str(tmp_path / "p.sbpolicy"),
                                 "--request", str(request), "--state-dir", str(tmp_path / "s"),
                                 "--format", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["result"]["ok"] is True
    # the executors were made (every plugin loads) and neither walked nor ran a trial sandbox
    assert (warmups, trials) == (0, 0)
    listed, warmups, _ = _cli(tmp_path, "plugins", "--format", "json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "proc-bwrap" in listed.stdout
    assert warmups == 0


def test_a_run_that_starts_a_process_masks_what_a_warmed_engine_masks(tmp_path: Path) -> None:
    _files(tmp_path)
    done, warmups, trials = _cli(tmp_path, *_run_args(tmp_path, "cli-state"), "--", "python3",
                                 "-c", READER)
    assert done.returncode == 0, done.stderr[-2000:]
    # started by the call, not by the executors' construction
    assert (warmups, trials) == (1, 1)
    lazy: dict[str, Any] = json.loads(done.stdout)["result"]
    eager_run = subprocess.run([sys.executable, "-c", EAGER, str(tmp_path), READER],
                               cwd=tmp_path, env=_env(), capture_output=True, text=True,
                               timeout=120, check=False)
    assert eager_run.returncode == 0, eager_run.stderr[-2000:]
    eager: dict[str, Any] = json.loads(eager_run.stdout)
    assert lazy["ok"] is eager["ok"] is True, (lazy, eager)
    assert lazy["out"]["backend"] == eager["out"]["backend"] == "proc-bwrap"
    assert lazy["out"]["stdout"] == eager["out"]["stdout"]
    lines = dict(line.rsplit(" ", 1) for line in lazy["out"]["stdout"].splitlines())
    assert lines == {"shadow": "PermissionError", "gshadow": "PermissionError",
                     "prefix": "readable"}, lines
    assert "/etc/shadow" in lazy["out"]["masked"]
    assert sorted(lazy["out"]["masked"]) == sorted(eager["out"]["masked"])


def test_warm_ahead_is_the_faces_choice_not_a_configuration_key() -> None:
    from policy_engine.config import EngineConfig

    assert EngineConfig().warm_ahead is True  # the Python API and servers warm ahead
    with pytest.raises(ValueError, match="unknown configuration key `warm_ahead`"):
        EngineConfig.from_mapping({"warm_ahead": False})


def test_an_unwatched_stored_walk_is_checked_again_by_a_second_plan(tmp_path: Path) -> None:
    """A one-call process's warm-up checks the stored walks for its first plan and puts no
    watches; a second plan in it (``spec._await_warmup``) unwatches them first
    (``listing_store.unwatch_loaded``) and so sees a secret planted after the first check."""
    import random
    import time

    from policy_engine.sandbox import listing_store
    from policy_engine.sandbox.masks import RACY_NS, DirCache, plan_masks
    from tests.integration.test_mask_rewalk import PATTERNS, fresh, make_tree

    root, state = tmp_path / "tree", tmp_path / "state"
    root.mkdir()
    state.mkdir(mode=0o700)
    dirs = make_tree(root, random.Random(7))
    time.sleep(RACY_NS / 1e9 + 0.2)  # older than the racy window, as a system tree is
    cache = DirCache()
    plan_masks([], [str(root)], list(PATTERNS), "/nonexistent", cache)
    store = str(state / "walks.bin")
    listing_store.save(cache, [str(root)], store)
    for unwatch in (False, True):
        again = DirCache()
        listing_store.load(again, store, watch=False)  # the warm-up's check
        first = plan_masks([], [str(root)], list(PATTERNS), "/nonexistent", again)
        assert first.files == fresh(root).files
        planted = dirs[30 + unwatch] / ".env"
        planted.write_text("planted after the check")
        if unwatch:
            assert listing_store.unwatch_loaded(again) >= 1
        second = plan_masks([], [str(root)], list(PATTERNS), "/nonexistent", again)
        # left as loaded, the record stands on the first check and misses it: the step is
        # what makes the second plan look
        assert (str(planted) in second.files) is unwatch, second.files
        planted.unlink()
