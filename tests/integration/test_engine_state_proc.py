"""Attack 36 for proc.exec: a profile binding the whole project (`fs.read, fs.write /p/**`)
holding the engine's state dir `./var` must not show the sandboxed process the evidence key or
the tokens, nor let it write there (a planted `tokens.sqlite-journal` is rolled back into the
database by SQLite's next open). Run for real on every proc backend, with the guard the
orchestrator hands the executor (``Guard(state_dir=...)``)."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_proc.executor import ProcExecutor
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from tests.integration.test_proc_sandbox import fs_cap, make_profile

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"
PROBE = textwrap.dedent("""
    import json, os, sys
    out = {}
    for key, path in json.loads(sys.argv[1]).items():
        try:
            if key.startswith("read"):
                out[key] = open(path).read()
            elif key.startswith("write"):
                out[key] = open(path, "w").write("planted")
            else:
                out[key] = sorted(os.listdir(path))
        except OSError as e:
            out[key] = "refused: " + os.strerror(e.errno or 0)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[str, ProcExecutor]]:
    made = {b: ProcExecutor(b) for b in ("bwrap", "landlock", "unshare")}
    for ex in made.values():
        assert ex.available() is True, ex.unavailable_reason
    yield made
    for ex in made.values():
        ex.close()


def _project(tmp_path: Path) -> tuple[Path, Path]:
    proj = tmp_path / "proj"
    state = proj / "var"
    for d in (state / "keys", state / "run_code" / "s1", proj / "src"):
        d.mkdir(parents=True)
    for p in (tmp_path, proj, state, state / "keys", state / "run_code",
              state / "run_code" / "s1", proj / "src"):
        p.chmod(0o755)
    (state / "keys" / "evidence-hmac.key").write_text("KEY-marker")
    (state / "tokens.sqlite").write_text("TOKENS-marker")
    (state / "run_code" / "s1" / "w.txt").write_text("workspace")
    (proj / "src" / "a.txt").write_text("source")
    return proj, state


def _run(ex: ProcExecutor, proj: Path, state: Path, cwd: Path,
         targets: dict[str, str]) -> dict[str, object]:
    base = make_profile(proj)
    profile = base.model_copy(update={"capabilities": (fs_cap("fs.read", f"{proj}/**"),
                                                       fs_cap("fs.write", f"{proj}/**"))})
    ctx = ExecContext(profile=profile, deadline=time.monotonic() + 60,
                      guard=Guard(state_dir=state))
    from policy_engine.model import ProcExecOp
    res = ex.execute(ctx, ProcExecOp(tool=PYTHON, args=("-c", PROBE, json.dumps(targets)),
                                     cwd=str(cwd)))
    assert res.ok, res
    assert res.out["exit_code"] == 0, res
    seen: dict[str, object] = json.loads(str(res.out["stdout"]))
    return seen


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "unshare"])
def test_a_project_bind_hides_the_state_dir(executors: dict[str, ProcExecutor],
                                            tmp_path: Path, backend: str) -> None:
    proj, state = _project(tmp_path)
    seen = _run(executors[backend], proj, state, proj / "src", {
        "read:key": f"{state}/keys/evidence-hmac.key", "read:tokens": f"{state}/tokens.sqlite",
        "read:src": f"{proj}/src/a.txt", "write:journal": f"{state}/tokens.sqlite-journal",
        "write:src": f"{proj}/src/b.txt", "list:state": str(state)})
    assert seen["read:src"] == "source", seen
    assert seen["write:src"] == len("planted"), seen
    assert "marker" not in json.dumps(seen), seen
    assert str(seen["write:journal"]).startswith("refused"), seen
    assert not (state / "tokens.sqlite-journal").exists()
    assert seen["list:state"] == [] or str(seen["list:state"]).startswith("refused"), seen


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "unshare"])
def test_a_workspace_cwd_under_the_state_dir_stays_visible(executors: dict[str, ProcExecutor],
                                                           tmp_path: Path, backend: str) -> None:
    proj, state = _project(tmp_path)
    seen = _run(executors[backend], proj, state, state / "run_code" / "s1", {
        "read:ws": f"{state}/run_code/s1/w.txt", "read:key": f"{state}/keys/evidence-hmac.key",
        "read:tokens": f"{state}/tokens.sqlite", "write:ws": f"{state}/run_code/s1/out.txt"})
    assert seen["read:ws"] == "workspace", seen
    assert seen["write:ws"] == len("planted"), seen
    assert "marker" not in json.dumps(seen), seen
