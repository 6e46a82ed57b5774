"""A session file path names a file inside the workspace, never the workspace itself."""

from __future__ import annotations

import pytest

from policy_engine.gateway.session_files import relative
from policy_engine.refusal import PolicyRefusal


@pytest.mark.parametrize("path", ["", ".", "./", "..", "a/../b", "/etc/passwd", "a\0b",
                                  "x" * 1025])
def test_paths_that_leave_or_replace_the_workspace_are_refused(path: str) -> None:
    """`.` was taken: an upload to it replaced the workspace directory with a file and every
    later read of the session failed with a 500 (schemathesis found it)."""
    with pytest.raises(PolicyRefusal) as caught:
        relative(path)
    assert caught.value.refusal.code == "SCHEMA.VALIDATION_FAILED"
    assert caught.value.refusal.location == "path"


@pytest.mark.parametrize(("path", "clean"), [("a", "a"), ("./a", "a"), ("a/b/", "a/b"),
                                             ("dir/./f.txt", "dir/f.txt")])
def test_a_relative_path_is_cleaned(path: str, clean: str) -> None:
    assert relative(path) == clean
