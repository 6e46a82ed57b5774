"""Path normalization and symlink resolution beneath a root (guard.paths)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.paths import is_beneath, normalize_path, resolve_beneath


@pytest.mark.parametrize(("raw", "want"), [
    ("/workspace/a.txt", "/workspace/a.txt"),
    ("/workspace//a.txt", "/workspace/a.txt"),
    ("/workspace/./a.txt", "/workspace/a.txt"),
    ("/workspace/dir/", "/workspace/dir"),
    ("/", "/"),
    ("//", "/"),
    ("/workspace/.env", "/workspace/.env"),
    ("/workspace/..x", "/workspace/..x"),
])
def test_normalize_path_accepts(raw: str, want: str) -> None:
    assert normalize_path(raw) == want


@pytest.mark.parametrize("raw", [
    "/workspace/../etc/passwd", "/workspace/a/..", "/..", "/workspace/a\x00.txt",
    "workspace/a.txt", "./a", "", "~/x", "../etc",
])
def test_normalize_path_refuses_traversal(raw: str) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        normalize_path(raw)
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    assert exc.value.reason.startswith("path traversal")


def test_is_beneath_uses_segment_boundary() -> None:
    assert is_beneath("/workspace", "/workspace")
    assert is_beneath("/workspace", "/workspace/x")
    assert not is_beneath("/workspace", "/workspace-evil/x")
    assert not is_beneath("/workspace", "/work")
    assert is_beneath("/", "/anything")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "dir" / "sub").mkdir(parents=True)
    (r / "dir" / "file.txt").write_text("x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("s")
    return r


def test_plain_paths_resolve_to_themselves(root: Path) -> None:
    assert resolve_beneath(str(root), f"{root}/dir/file.txt") == f"{root}/dir/file.txt"
    assert resolve_beneath(str(root), f"{root}/missing/a/b") == f"{root}/missing/a/b"
    assert resolve_beneath(str(root), str(root)) == str(root)


def test_symlink_inside_root_is_resolved(root: Path) -> None:
    os.symlink("dir/file.txt", root / "rel-link")
    os.symlink(f"{root}/dir", root / "abs-link")
    assert resolve_beneath(str(root), f"{root}/rel-link") == f"{root}/dir/file.txt"
    assert resolve_beneath(str(root), f"{root}/abs-link/file.txt") == f"{root}/dir/file.txt"
    assert resolve_beneath(str(root), f"{root}/abs-link/new.txt") == f"{root}/dir/new.txt"


def test_relative_dotdot_link_within_root(root: Path) -> None:
    os.symlink("../file.txt", root / "dir" / "sub" / "up")
    assert resolve_beneath(str(root), f"{root}/dir/sub/up") == f"{root}/dir/file.txt"


@pytest.mark.parametrize("target", ["../outside/secret", "/etc/passwd", "../../../../etc",
                                    "{tmp}/outside"])
def test_symlink_leaving_root_is_refused(root: Path, target: str) -> None:
    os.symlink(target.format(tmp=root.parent), root / "evil")
    with pytest.raises(PolicyEngineError) as exc:
        resolve_beneath(str(root), f"{root}/evil")
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED
    assert "leaves the root" in exc.value.reason


def test_symlinked_directory_leaving_root_refuses_new_files_beneath(root: Path) -> None:
    os.symlink(root.parent / "outside", root / "dir" / "out")
    with pytest.raises(PolicyEngineError) as exc:
        resolve_beneath(str(root), f"{root}/dir/out/new-file.txt")
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED


def test_symlink_chain_leaving_root_is_refused(root: Path) -> None:
    os.symlink("b", root / "a")
    os.symlink("dir/sub/c", root / "b")
    os.symlink("../../../outside/secret", root / "dir" / "sub" / "c")
    with pytest.raises(PolicyEngineError) as exc:
        resolve_beneath(str(root), f"{root}/a")
    assert exc.value.code is ErrorCode.CAPABILITY_BLOCKED


def test_symlink_chain_inside_root_resolves(root: Path) -> None:
    os.symlink("b", root / "a")
    os.symlink("dir/sub/../file.txt", root / "b")
    assert resolve_beneath(str(root), f"{root}/a") == f"{root}/dir/file.txt"


def test_absolute_target_through_prefix_sibling_is_refused(root: Path) -> None:
    sibling = root.parent / (root.name + "-evil")
    sibling.mkdir()
    os.symlink(str(sibling), root / "s")
    with pytest.raises(PolicyEngineError):
        resolve_beneath(str(root), f"{root}/s")


def test_symlink_loop_is_refused(root: Path) -> None:
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    with pytest.raises(PolicyEngineError) as exc:
        resolve_beneath(str(root), f"{root}/loop1")
    assert "too many symlinks" in exc.value.reason


def test_path_outside_root_is_refused(root: Path) -> None:
    with pytest.raises(PolicyEngineError) as exc:
        resolve_beneath(str(root), f"{root}-evil/x")
    assert "outside the root" in exc.value.reason


def _spellings() -> list[str]:
    """Every path of up to three segments from a set covering each rule of the fast path."""
    import itertools

    segs = ["a", "", ".", "..", ".x", "..x", "x.", "a\x00", "workspace"]
    out = ["", "/", "a", "a/"]
    for n in (1, 2, 3):
        for parts in itertools.product(segs, repeat=n):
            body = "/".join(parts)
            out += ["/" + body, "/" + body + "/", body]
    return out


def test_resolve_fs_normalizes_as_normalize_path() -> None:
    # resolve_fs spells normalize_path's fast path out (a call less per fs decision): for every
    # spelling it answers normalize_path's path, or refuses as it does
    from policy_engine.guard import Guard
    from policy_engine.guard.resolve import resolve_fs
    from tests.unit.guard_fixtures import make_profile

    cp = Guard().compiled(make_profile())
    for raw in _spellings():
        try:
            want: object = normalize_path(raw)
        except PolicyEngineError as exc:
            want = (exc.code, exc.reason)
        try:
            got: object = resolve_fs(cp, raw, False, False)[0]
        except PolicyEngineError as exc:
            got = (exc.code, exc.reason)
        assert got == want, raw


def test_a_str_subclass_is_not_taken_for_a_normal_path() -> None:
    class Lying(str):
        def __contains__(self, item: object) -> bool:
            return False

    from policy_engine.guard import Guard
    from policy_engine.guard.resolve import resolve_fs
    from tests.unit.guard_fixtures import make_profile

    cp = Guard().compiled(make_profile())
    raw = Lying("/workspace/../etc/passwd")
    for fn in (normalize_path, lambda p: resolve_fs(cp, p, False, False)[0]):
        with pytest.raises(PolicyEngineError) as exc:
            fn(raw)
        assert "`..` segment" in exc.value.reason
