"""The synthetic /etc/passwd and /etc/group a bwrap sandbox sees are written once per machine
and user, not once per process: every engine process (each CLI `run`) used to leave a
``pe-etc-*`` directory in the temporary directory for good (2,706 on this host after a day).
A directory someone else planted under the shared name is never used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.executor_proc.synthetic_etc import SYNTHETIC_ETC, shared_name

ROOT = Path(__file__).resolve().parents[2]
# the child reads the files itself: a private copy is removed when it exits
ASK = ("import json; from plugins.executor_proc.bwrap import synthetic_etc; "
       "got = synthetic_etc(); "
       "print(json.dumps({p: [h, open(h).read()] for p, h in got.items()}))")


def _ask(tmp: Path) -> dict[str, list[str]]:
    """Sandbox path → [host file, what the child read there]."""
    done = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True,
                          timeout=60, check=True, cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)})
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def _entries(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir())


def test_processes_share_one_directory_and_leave_nothing_else(tmp_path: Path) -> None:
    first = _ask(tmp_path)
    for _ in range(3):
        assert _ask(tmp_path) == first
    assert len(_entries(tmp_path)) == 1, _entries(tmp_path)
    for path, text in SYNTHETIC_ETC.items():
        host, seen = first[path]
        assert seen == text
        assert Path(host).read_text() == text  # kept after the process ended: shared
        assert Path(host).parent == tmp_path / shared_name()
        assert not os.stat(host).st_mode & 0o222


@pytest.mark.parametrize("plant", ["other-owner", "writable", "wrong-content", "symlink"])
def test_a_planted_directory_under_the_shared_name_is_not_used(tmp_path: Path,
                                                              plant: str) -> None:
    shared = tmp_path / shared_name()
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "passwd").write_text("attacker:x:0:0::/:/bin/sh\n")
    (decoy / "group").write_text(SYNTHETIC_ETC["/etc/group"])
    if plant == "symlink":
        shared.symlink_to(decoy)
    else:
        decoy.rename(shared)
        if plant == "other-owner":
            os.chown(shared, 12345, 12345)
            (shared / "passwd").write_text(SYNTHETIC_ETC["/etc/passwd"])
        elif plant == "writable":
            (shared / "passwd").write_text(SYNTHETIC_ETC["/etc/passwd"])
            shared.chmod(0o777)
    got = _ask(tmp_path)
    host, seen = got["/etc/passwd"]
    assert seen == SYNTHETIC_ETC["/etc/passwd"]
    assert os.path.realpath(host) != os.path.realpath(shared / "passwd")
    assert not Path(host).exists()  # the private copy went with its process
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["decoy"] * (plant == "symlink")
                                                                 + [shared.name])
