"""The bwrap and unshare trial sandboxes are run once per binary file in a process
(``bwrap._PASSED``): a binary replaced since, or one that fails, is probed again."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from plugins.executor_proc import bwrap, unshare

pytestmark = pytest.mark.integration


def _copy(src: str | None, dst: Path) -> str:
    assert src is not None
    shutil.copy2(os.path.realpath(src), dst)
    return str(dst)


def _trials(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    seen: list[list[str]] = []
    real = subprocess.run

    def run(argv: list[str], *args: object, **kwargs: object) -> object:
        seen.append(list(argv))
        return real(argv, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(bwrap.subprocess, "run", run)
    return seen


def test_a_passed_bwrap_probe_is_kept_for_the_same_binary_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trials = _trials(monkeypatch)
    binary = _copy(shutil.which("bwrap"), tmp_path / "bwrap")
    first = bwrap.probe(configured=binary)
    assert first.ok, first.reason
    again = bwrap.probe(configured=binary)
    assert again == first
    assert len(trials) == 1  # the second answer is the kept one
    # the same path now holds a binary that cannot make a sandbox: probed, and refused
    os.unlink(binary)
    Path(binary).write_text("#!/bin/sh\necho no namespaces here >&2\nexit 1\n")
    os.chmod(binary, 0o755)
    broken = bwrap.probe(configured=binary)
    assert len(trials) == 2
    assert not broken.ok
    assert "no namespaces here" in broken.reason
    assert not bwrap.probe(configured=binary).ok  # a failure is never kept
    assert len(trials) == 3


def test_a_passed_unshare_probe_is_kept_for_the_same_binary_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trials = _trials(monkeypatch)  # the same subprocess module
    binary = _copy(shutil.which("unshare"), tmp_path / "unshare")
    first = unshare.probe(binary, None)
    assert first.ok, first.reason
    assert unshare.probe(binary, None) == first
    assert len(trials) == 1
    os.unlink(binary)
    Path(binary).write_text("#!/bin/sh\necho unshare refused >&2\nexit 1\n")
    os.chmod(binary, 0o755)
    broken = unshare.probe(binary, None)
    assert len(trials) == 2
    assert not broken.ok
    assert "unshare refused" in broken.reason
