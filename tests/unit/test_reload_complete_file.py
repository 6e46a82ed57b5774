"""Issue 32 item 8: a reload takes only a complete policy file. The kernel's read-lease answer
says whether a writer still has the file open (a real writer process here); where that cannot
be asked, only an atomic replace (rename) is taken and an in-place write is refused in health.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from policy_engine.rollout.reload import PolicyReloader, open_for_writing
from tests.unit.test_hot_reload import B, setup

HOLD = """import sys, time
fh = open(sys.argv[1], sys.argv[2])
print("open", flush=True)
time.sleep(30)
"""


def _holder(path: Path, mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), mode],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "open\n"
    return proc


def test_the_kernel_says_whether_a_writer_still_holds_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.sbpolicy"
    path.write_text("x")
    assert open_for_writing(path) is False
    writer = _holder(path, "a")
    try:
        assert open_for_writing(path) is True
    finally:
        writer.kill()
        writer.wait()
    reader = _holder(path, "r")  # a reader is no writer
    try:
        assert open_for_writing(path) is False
    finally:
        reader.kill()
        reader.wait()
    assert open_for_writing(path) is False


def test_a_file_still_open_for_writing_is_not_loaded_however_long_it_waits(
        tmp_path: Path) -> None:
    orch, entry = setup(tmp_path)
    hash_a = orch.policyset.version_hash
    reloader = PolicyReloader(orch, [entry])
    assert reloader.writer_probe
    writer = _holder(entry, "a")
    try:
        with entry.open("w") as fh:  # B, complete and compiling, but its writer is not done
            fh.write(B)
        for _ in range(10):
            assert reloader.check() is False
        assert orch.policyset.version_hash == hash_a
        assert reloader.health()["status"] == "ok"
    finally:
        writer.kill()
        writer.wait()
    assert reloader.check() is True  # the writer is gone: the file is whole
    assert orch.policyset.version == "2.0.0"


def test_without_the_kernels_answer_only_an_atomic_replace_is_taken(tmp_path: Path) -> None:
    orch, entry = setup(tmp_path)
    hash_a = orch.policyset.version_hash
    reloader = PolicyReloader(orch, [entry], writer_probe=False)
    entry.write_text(B)  # in place, complete and closed: still cannot be told from a pause
    for _ in range(4):
        assert reloader.check() is False
    assert orch.policyset.version_hash == hash_a
    health = reloader.health()
    assert health["status"] == "degraded"
    assert "changed in place" in health["reload_error"]
    tmp = entry.with_name("p.sbpolicy.new")
    tmp.write_text(B)
    os.replace(tmp, entry)  # the same content, renamed over: taken
    deadline = time.monotonic() + 5
    while not reloader.check():
        assert time.monotonic() < deadline
    assert orch.policyset.version == "2.0.0"
    assert reloader.health()["status"] == "ok"
