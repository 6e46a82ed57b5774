"""The fs executor's openers and rename take names that are not UTF-8 (outsider round 10, F1).

Names come from ``os.fsdecode`` (surrogate escapes), as the guard decided them; each helper must
encode them as the ``os`` functions do, on the openat2 path and on the component walk alike.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugins.executor_fs.resolve import BeneathOpener, openat2_available, rename_noreplace

NAME = os.fsdecode(b"k\xff")


@pytest.mark.parametrize("use_openat2", [True, False])
def test_open_beneath_a_non_utf8_directory(tmp_path: Path, use_openat2: bool) -> None:
    if use_openat2 and not openat2_available():
        pytest.fail("this kernel has no openat2; the fs executor's main path is untested")
    os.mkdir(bytes(tmp_path) + b"/d\xfe")
    with open(bytes(tmp_path) + b"/d\xfe/k\xff", "wb") as fh:
        fh.write(b"data")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        opener = BeneathOpener(use_openat2)
        fd = opener.open(root, [os.fsdecode(b"d\xfe"), NAME], os.O_RDONLY)
        try:
            assert os.read(fd, 10) == b"data"
        finally:
            os.close(fd)
        assert opener.method == ("openat2" if use_openat2 else "openat-walk")
    finally:
        os.close(root)


def test_rename_noreplace_with_non_utf8_names(tmp_path: Path) -> None:
    with open(bytes(tmp_path) + b"/t\xff", "wb") as fh:
        fh.write(b"new")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        rename_noreplace(fd, os.fsdecode(b"t\xff"), NAME)
        with open(bytes(tmp_path) + b"/t\xfe", "wb") as fh:
            fh.write(b"other")
        with pytest.raises(FileExistsError):
            rename_noreplace(fd, os.fsdecode(b"t\xfe"), NAME)
    finally:
        os.close(fd)
    assert sorted(os.listdir(bytes(tmp_path))) == [b"k\xff", b"t\xfe"]
    with open(bytes(tmp_path) + b"/k\xff", "rb") as fh:
        assert fh.read() == b"new"
