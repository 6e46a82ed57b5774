"""Names that are not UTF-8 beneath the fs root (outsider round 10, F1 and F2).

A sandboxed process can create such names. F1: a symlink to one was allowed by ``explain`` and
the run's fs executor crashed encoding the resolved path (``TOOL.EXECUTION_FAILED``). F2: one
such entry made every ``fs.list`` of its directory fail. Both run here through the orchestrator
on the real fs executor, in a real tree under ``tmp_path``.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_engine.model import FsListOp, FsReadOp, FsWriteOp
from tests.integration.test_dry_run_fs_facts import POLICY, World, make_world

pytestmark = pytest.mark.integration
BLOCKED = "SANDBOX.CAPABILITY_BLOCKED"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield from make_world(tmp_path, POLICY)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ---- F1: a link to a name that is not UTF-8 is read and written where explain said --------------

def test_read_through_a_link_to_a_non_utf8_directory(world: World) -> None:
    root = bytes(world.root)
    os.makedirs(root + b"/work/\xffdir")
    with open(root + b"/work/\xffdir/f", "wb") as fh:
        fh.write(b"hello\n")
    os.symlink(b"\xffdir", root + b"/work/lnu")
    dry, ran = world.both(FsReadOp(path=f"{world.root}/work/lnu/f"))
    assert dry.allowed, dry
    assert ran.result.ok, ran.result
    assert base64.b64decode(ran.result.out["bytes_b64"]) == b"hello\n"
    dry, ran = world.both(FsListOp(path=f"{world.root}/work/lnu", depth=1))
    assert dry.allowed, dry
    assert ran.result.ok, ran.result
    assert [e["path"] for e in ran.result.out["entries"]] == ["f"]


def test_write_through_links_to_non_utf8_names(world: World) -> None:
    root = bytes(world.root)
    os.makedirs(root + b"/work/\xffdir")
    os.symlink(b"\xffdir", root + b"/work/lnu")
    with open(root + b"/work/k\xff", "wb") as fh:
        fh.write(b"old")
    os.symlink(b"k\xff", root + b"/work/lk")
    # a new file in the linked directory, refused if it appeared meanwhile (renameat2)
    dry, ran = world.both(FsWriteOp(path=f"{world.root}/work/lnu/new.txt",
                                    bytes_b64=b64(b"new"), overwrite=False))
    assert dry.allowed, dry
    assert ran.result.ok, ran.result
    with open(root + b"/work/\xffdir/new.txt", "rb") as fh:
        assert fh.read() == b"new"
    # the link's own non-UTF-8 target replaced (temporary name and rename beside it)
    dry, ran = world.both(FsWriteOp(path=f"{world.root}/work/lk", bytes_b64=b64(b"fresh"),
                                    overwrite=True))
    assert dry.allowed, dry
    assert ran.result.ok, ran.result
    with open(root + b"/work/k\xff", "rb") as fh:
        assert fh.read() == b"fresh"
    assert os.path.islink(root + b"/work/lk")
    # the same target without overwrite: both refuse with the same code
    dry, ran = world.both(FsWriteOp(path=f"{world.root}/work/lk", bytes_b64=b64(b"x"),
                                    overwrite=False))
    assert (dry.code, ran.result.code) == (BLOCKED, BLOCKED), (dry, ran.result)
    assert sorted(os.listdir(root + b"/work")) == [b"k\xff", b"lk", b"lnu", b"\xffdir"]


def test_a_link_to_a_non_utf8_name_in_a_forbidden_directory_is_refused_alike(
        world: World) -> None:
    root = bytes(world.root)
    with open(root + b"/private/k\xff", "wb") as fh:
        fh.write(b"PRIVATE")
    os.symlink(b"../private/k\xff", root + b"/work/lp")
    dry, ran = world.both(FsReadOp(path=f"{world.root}/work/lp"))
    assert (dry.code, dry.rule.id if dry.rule else None) == (BLOCKED, "no-private")
    assert ran.result.code == BLOCKED, ran.result
    assert "PRIVATE" not in str(ran.result.out)


# ---- F2: a listing with entries whose names are not UTF-8 -------------------------------------

def test_a_non_utf8_entry_is_listed_escaped_and_the_rest_is_listed(world: World) -> None:
    root = bytes(world.root)
    (world.root / "work" / "a.txt").write_text("a\n")
    with open(root + b"/work/\xffname", "wb") as fh:
        fh.write(b"bb\n")
    os.makedirs(root + b"/work/d\xfe")
    with open(root + b"/work/d\xfe/in.txt", "wb") as fh:
        fh.write(b"c")
    (world.root / "work" / "\\xffname").write_text("a real name with a backslash")
    dry, ran = world.both(FsListOp(path=f"{world.root}/work", depth=2))
    assert dry.allowed, dry
    assert ran.result.ok, ran.result
    out = ran.result.out
    entries = {(e["path"], e.get("not_utf8", False)): e for e in out["entries"]}
    assert set(entries) == {("a.txt", False), ("\\xffname", True), ("\\xffname", False),
                            ("d\\xfe", True), ("d\\xfe/in.txt", True)}
    assert entries[("\\xffname", True)]["size"] == 3
    assert entries[("d\\xfe", True)]["type"] == "dir"
    assert out["count"] == 5
    assert out["not_utf8"] == 3


def test_a_non_utf8_entry_is_still_judged_by_the_forbids(tmp_path: Path) -> None:
    source = POLICY + 'forbid "no-pem" fs.read, fs.list paths ["**/*.pem"]\n' \
        'forbid "no-rsa" fs.read, fs.list paths ["**/id_rsa?.key"]\n'
    for w in make_world(tmp_path, source):
        root = bytes(w.root)
        for name in (b"id_rsa\xff.pem", b"id_rsa\xff.key", b"ok\xff.txt", b"plain.pem"):
            with open(root + b"/work/" + name, "wb") as fh:
                fh.write(b"SECRET")
        (w.root / "work" / "seen.txt").write_text("x")
        dry, ran = w.both(FsListOp(path=f"{w.root}/work", depth=1))
        assert dry.allowed, dry
        assert ran.result.ok, ran.result
        assert sorted(e["path"] for e in ran.result.out["entries"]) == ["ok\\xff.txt",
                                                                       "seen.txt"]
        assert ran.result.out["not_utf8"] == 1
        # inside a forbidden directory nothing is listed, whatever the names
        with open(root + b"/private/x\xff", "wb") as fh:
            fh.write(b"P")
        dry, ran = w.both(FsListOp(path=f"{w.root}/private", depth=1))
        assert dry.code == BLOCKED
        assert ran.result.code == BLOCKED
