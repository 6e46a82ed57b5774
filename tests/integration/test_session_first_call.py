"""A session's first call costs what any call costs: ending another session (its workspace
removed) does not make the next plan walk the system trees again, and a workspace removed and
made again at the same path is planned anew (its secrets masked)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from plugins.executor_proc import spec
from policy_engine.sandbox.masks import DEFAULT_CACHE, DirCache, plan_masks
from tests.integration.test_sessions_runtime import sessions_in

pytestmark = pytest.mark.integration

PATTERNS = ("/**/.env", "/**/secrets.json")


def _system_records(cache: DirCache) -> dict[object, object]:
    """The walk records of the system trees (keyed by their roots), by key."""
    return {key: rec for key, rec in cache.walks.items()
            if isinstance(key, tuple) and key[0] and key[0][0][0] in ("/usr", "/etc")}


def test_deleting_a_session_keeps_the_system_trees_walk(tmp_path: Path) -> None:
    with sessions_in(tmp_path, max_live=4) as rt:
        a = rt.create("t", "s", security_mode="permissive")
        assert rt.run_code("t", "s", a.session_id, "print(1)").stdout == "1\n"
        spec.prewarm(wait=True)
        b = rt.create("t", "s", security_mode="permissive")
        assert rt.run_code("t", "s", b.session_id, "print(2)").stdout == "2\n"
        before = _system_records(DEFAULT_CACHE)
        assert before, "the system trees were walked and their records kept"
        assert rt.delete("t", "s", a.session_id)["workspace_removed"]
        c = rt.create("t", "s", security_mode="permissive")
        assert rt.run_code("t", "s", c.session_id, "print(3)").stdout == "3\n"
        after = _system_records(DEFAULT_CACHE)
        # the same records, reused: a full invalidation made new ones (the /usr and Python
        # prefix walk, 200-400 ms, on the first call after every session's end)
        assert {k: id(r) for k, r in after.items()} == {k: id(r) for k, r in before.items()}


def test_a_workspace_removed_and_made_again_is_planned_anew(tmp_path: Path) -> None:
    sys_tree, ws = tmp_path / "sys", tmp_path / "ws"
    (sys_tree / "lib" / "deep").mkdir(parents=True)
    (ws / "a" / "sub").mkdir(parents=True)
    (ws / "b").mkdir()
    cache = DirCache()

    def plan(bound: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
        warm = plan_masks([str(bound)], [str(sys_tree)], PATTERNS, "/root", cache)
        cold = plan_masks([str(bound)], [str(sys_tree)], PATTERNS, "/root",
                          DirCache(watch=False))
        assert (warm.files, warm.dirs) == (cold.files, cold.dirs)
        return warm.files, warm.dirs

    assert plan(ws / "a") == ((), ())
    assert plan(ws / "b") == ((), ())
    shutil.rmtree(ws / "a")  # watched directories deleted (a session's end)
    assert plan(ws / "b") == ((), ())
    (ws / "a" / "sub").mkdir(parents=True)  # the same paths made again, with secrets
    (ws / "a" / ".env").write_text("TOKEN=x")
    (ws / "a" / "sub" / "secrets.json").write_text("{}")
    assert plan(ws / "a")[0] == (str(ws / "a" / ".env"), str(ws / "a" / "sub" / "secrets.json"))
    shutil.rmtree(ws / "a" / "sub")  # a nested watched directory, then made again
    (ws / "a" / "sub").mkdir()
    (ws / "a" / "sub" / ".env").write_text("TOKEN=y")
    assert plan(ws / "a")[0] == (str(ws / "a" / ".env"), str(ws / "a" / "sub" / ".env"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".env").write_text("TOKEN=z")
    shutil.rmtree(ws / "a")  # made again as a link to a tree holding a secret
    (ws / "a").symlink_to(elsewhere)
    plan(ws / "a")  # the warm plan equals the cold one (checked inside)
    (sys_tree / "lib" / "deep" / ".env").write_text("K=v")  # the system tree still followed
    assert str(sys_tree / "lib" / "deep" / ".env") in plan(ws / "b")[0]
