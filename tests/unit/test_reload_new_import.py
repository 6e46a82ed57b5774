"""Attack32 M4: the writer check covers every file of the *candidate* bundle, not only the files
the last good bundle imported, and nothing is swapped in when a file changed while it compiled.
Real files, a real writer process holding the new import open; the orchestrator's own policy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.rollout import reload as reload_mod
from policy_engine.rollout.reload import PolicyReloader
from tests.unit.test_hot_reload import A, setup

HEAD = 'policy "reload/sub" version "1.0.0"\n'
FORBID = 'forbid "no-tmp" tmp.use\n'
# A, importing a new file too
A_SUB = A.replace('import "limits.sbpolicy"\n', 'import "limits.sbpolicy"\nimport "sub.sbpolicy"\n')
HOLD = """import sys, time
fh = open(sys.argv[1], "w")
fh.write(sys.argv[2])
fh.flush()
print("open", flush=True)
sys.stdin.readline()
fh.write(sys.argv[3])
fh.close()
"""


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rules(reloader: PolicyReloader) -> set[str]:
    return {r.id for r in reloader.orchestrator.policyset.rules}


def _settle(reloader: PolicyReloader, polls: int = 8) -> bool:
    return any([reloader.check() for _ in range(polls)])


def test_a_new_import_still_open_for_writing_waits_for_its_writer(tmp_path: Path) -> None:
    orch, entry = setup(tmp_path)
    reloader = PolicyReloader(orch, [entry])
    assert reloader.writer_probe
    sub = tmp_path / "sub.sbpolicy"
    writer = subprocess.Popen([sys.executable, "-c", HOLD, str(sub), HEAD, FORBID],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdin is not None
        assert writer.stdout.readline() == "open\n"
        _replace(entry, A_SUB)  # atomic: the entry is whole, its new import is not
        assert not _settle(reloader, 10)
        assert "no-tmp" not in _rules(reloader)
        assert reloader.reloads == 0
        assert reloader.health()["status"] == "ok"  # waiting is no error
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
        writer.wait()
    assert _settle(reloader)
    assert "no-tmp" in _rules(reloader)
    assert reloader.reloads == 1
    assert Path(str(sub)) in {Path(f) for f in orch.policyset.files}


def test_an_import_that_appears_later_is_loaded_once_it_is_there(tmp_path: Path) -> None:
    """A bundle naming a file not there yet fails (SBP204); the file appearing is a change
    of the bundle, so it is compiled again without the entry file being touched."""
    orch, entry = setup(tmp_path)
    reloader = PolicyReloader(orch, [entry])
    _replace(entry, A_SUB)
    assert not _settle(reloader)
    assert "SBP204" in (reloader.health()["reload_error"] or "")
    _replace(tmp_path / "sub.sbpolicy", HEAD + FORBID)
    assert _settle(reloader)
    assert "no-tmp" in _rules(reloader)
    assert reloader.health()["status"] == "ok"


def test_a_file_changed_while_it_compiles_is_not_swapped_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race is made deterministic: the real compiler runs, then a real write lands on the
    new import before the reloader looks again (a writer that opened, wrote and closed the
    file between the writer check and the compile's read)."""
    orch, entry = setup(tmp_path)
    reloader = PolicyReloader(orch, [entry])
    sub = tmp_path / "sub.sbpolicy"
    sub.write_text(HEAD)
    _replace(entry, A_SUB)
    raced: list[str] = []

    def compile_then_write(paths: list[Path]) -> object:
        compiled = compile_files(paths)
        if not raced:
            sub.write_text(HEAD + FORBID)
            raced.append(compiled.version_hash)
        return compiled

    monkeypatch.setattr(reload_mod, "compile_files", compile_then_write)
    deadline = time.monotonic() + 10
    while not reloader.check():
        assert time.monotonic() < deadline
    assert raced  # the compile that read the header only was made, and dropped
    assert orch.policyset.version_hash != raced[0]
    assert "no-tmp" in _rules(reloader)
    assert reloader.reloads == 1
