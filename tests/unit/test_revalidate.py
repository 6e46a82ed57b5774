"""The stored walk's revalidation: the C loop and the Python loop give the same answers on the
same directories (changed, gone, replaced by a file, never trusted), and watch the same ones."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from policy_engine.sandbox import revalidate
from policy_engine.sandbox.watch import MASK, Watcher


def stamp(p: Path) -> tuple[int, int, int]:
    st = os.lstat(p)
    return st.st_dev, st.st_ino, st.st_ctime_ns


def test_the_native_loop_is_built_here() -> None:
    assert revalidate.NATIVE, "policy_engine/sandbox/_revalidate.c was not built: install gcc " \
        "and python3-dev, then reinstall (setup.py)"


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("watch", [True, False], ids=["watched", "unwatched"])
def test_changed_directories_are_reported_and_watched(tmp_path: Path, native: bool,
                                                      watch: bool) -> None:
    dirs = [tmp_path / f"d{i}" for i in range(6000)]  # past one thread's share in C
    for d in dirs:
        d.mkdir()
    stamps = [stamp(d) for d in dirs]
    stamps[5] = revalidate.UNTRUSTED  # a racy listing: never vouched for
    (dirs[10] / "new").write_text("x")  # a name added: ctime moves
    os.rmdir(dirs[20])  # gone
    dirs[30].rmdir()
    dirs[30].write_text("a file now")
    os.rmdir(dirs[40])
    dirs[40].mkdir()  # the same name, another inode
    blob = revalidate.pack_paths([str(d) for d in dirs])
    packed = b"".join(revalidate.STAMP.pack(*s) for s in stamps)
    watcher = Watcher()
    fd = watcher.fd if watch else -1
    idx, wds = revalidate.changed(blob, packed, fd, MASK, native=native)
    assert idx == [5, 10, 20, 30, 40]
    if watch:
        names = [str(d) for d in dirs]
        # max_user_watches is the uid's, shared with every process of it (other engines, test
        # workers): past it a watch fails with ENOSPC, and the watcher must then give up
        full = -errno.ENOSPC
        assert all(w > 0 or w == full for i, w in enumerate(wds) if i not in (20, 30))
        assert wds[20] in (-errno.ENOENT, full)
        assert wds[30] in (-errno.ENOTDIR, full)
        if full in wds:
            assert not watcher.adopt(names, wds)
            assert not watcher.usable
        else:
            assert watcher.adopt(names, wds)  # ENOENT, ENOTDIR: reported changed anyway
            (dirs[7] / "later").write_text("x")
            watcher.drain()
            assert watcher.since(0) == [str(dirs[7])]
    else:
        assert set(wds) == {0}
    watcher.close()


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_paths_and_stamps_that_do_not_match_are_refused(native: bool) -> None:
    with pytest.raises(ValueError, match="do not match"):
        revalidate.changed(b"/a\0/b\0", revalidate.STAMP.pack(1, 2, 3), -1, 0, native=native)
