"""Mask walks kept on disk between runs: a restart reuses them after checking every directory's
stamp, and a secret planted while the engine was stopped is still masked by the first plan after
the restart (the same in the real sandbox: test_listing_store_sandbox.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from policy_engine.sandbox import listing_store
from policy_engine.sandbox.masks import RACY_NS, DirCache

ROOT = Path(__file__).resolve().parents[2]

# one engine run, in a process of its own: load the stored walks, plan the mandatory denies
# over the "system tree", store the walks, report what it masked and how many names it read
RUN = """
import json, sys
from policy_engine.compiler.builtins import MANDATORY_DENY_PATHS
from policy_engine.sandbox import listing_store
from policy_engine.sandbox.masks import DirCache, plan_masks
tree, store = sys.argv[1], sys.argv[2]
cache = DirCache(watch=False)
loaded = listing_store.load(cache, store)
plan = plan_masks([], [tree], list(MANDATORY_DENY_PATHS), "/nonexistent", cache=cache)
saved = listing_store.save(cache, [tree], store)
print(json.dumps({"loaded": loaded, "saved": saved, "files": list(plan.files),
                  "listed": cache.entries_listed}))
"""


def run_engine(tree: Path, store: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", RUN, str(tree), str(store)], cwd=ROOT,
                          capture_output=True, text=True, check=True, timeout=120)
    out: dict[str, object] = json.loads(done.stdout)
    return out


def system_tree(base: Path) -> Path:
    tree = base / "usr"
    for d in ("lib/python3/site", "lib/x86_64/deep/er", "share/doc/pkg"):
        (tree / d).mkdir(parents=True)
        (tree / d / "README").write_text("x")
    # listings taken within RACY_NS of a change are not trusted (nor stored): age the tree
    time.sleep(RACY_NS / 1e9 + 0.2)
    return tree


def test_a_secret_planted_while_stopped_is_masked_by_the_first_plan_after_restart(
        tmp_path: Path) -> None:
    tree = system_tree(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    store = state / "listings.bin"
    first = run_engine(tree, store)
    assert first["files"] == []
    assert first["loaded"] == 0
    assert isinstance(first["saved"], int)
    assert first["saved"] >= 9  # every directory of the tree
    # the engine is stopped; a secret is planted deep in the system tree
    secret = tree / "lib/x86_64/deep/er/.env"
    secret.write_text("TOKEN=1")
    again = run_engine(tree, store)
    assert again["loaded"] == first["saved"]
    assert str(secret) in again["files"]  # type: ignore[operator]
    # the stored walk was reused: only the changed directory was listed again
    assert again["listed"] == 2  # README and .env
    # a listing taken within RACY_NS of its directory's change is stored with a stamp that
    # never matches: once the change is older, the next run stores a true stamp and the one
    # after lists nothing
    time.sleep(RACY_NS / 1e9 + 0.2)
    for listed in (2, 0):
        later = run_engine(tree, store)
        assert str(secret) in later["files"]  # type: ignore[operator]
        assert later["listed"] == listed


def test_a_store_another_user_could_write_is_not_read(tmp_path: Path) -> None:
    tree = system_tree(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    store = state / "listings.bin"
    cache = DirCache(watch=False)
    run_engine(tree, store)
    os.chmod(store, 0o620)  # group-writable: someone else may have written it
    assert listing_store.load(cache, str(store)) == 0
    os.chmod(store, 0o600)
    os.chmod(state, 0o777)  # its directory: the file could have been swapped
    assert listing_store.load(cache, str(store)) == 0
    os.chmod(state, 0o700)
    assert listing_store.load(cache, str(store)) > 0


def test_a_malformed_store_loads_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    store = state / "listings.bin"
    cache = DirCache(watch=False)
    for content in (b"", b"not marshal data", b"\xe9\x02\x00\x00\x00"):
        store.write_bytes(content)
        os.chmod(store, 0o600)
        assert listing_store.load(cache, str(store)) == 0
    import marshal

    good_key = (("/x", ("/**/.env",)),)
    for row in [(good_key, b"/x\0", b"\0" * 23, b"\0" * 4, (("/**/.env",),), ()),  # short
                (good_key, b"/x\0", b"\0" * 24, b"\1\0\0\0", (("/**/.env",),), ()),  # frame 1
                (("/x",), b"/x\0", b"\0" * 24, b"\0" * 4, (), ()),  # a key of another shape
                ("/x", (1, 2), frozenset(), (), (), False, 0)]:  # the format of listings
        store.write_bytes(marshal.dumps((listing_store.FORMAT, [row])))
        os.chmod(store, 0o600)
        assert listing_store.load(cache, str(store)) == 0
    assert cache.walks == {}
