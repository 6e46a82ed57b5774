"""`policy-engine fmt`: write/--check/--diff/stdin, exit codes, atomic writes, soundness refusal,
and a snapshot of the formatted form of every example policy."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from policy_engine.cli.main import cli
from policy_engine.dsl import ast
from policy_engine.dsl.parser import parse_source
from policy_engine.fmt.printer import format_ast
from policy_engine.fmt.runner import Renderer, format_source, write_atomic
from policy_engine.fmt.soundness import compile_in_memory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.sbpolicy"))
UGLY = 'policy "p" version "1"\npermit   fs.read paths ["/a",  "/b"]   # why\n'
PRETTY = 'policy "p" version "1"\npermit fs.read  paths ["/a", "/b"]  # why\n'


class _Text(SingleFileSnapshotExtension):
    _write_mode = WriteMode.TEXT
    file_extension = "sbpolicy"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_snapshot(path: Path, snapshot: SnapshotAssertion) -> None:
    result = format_source(path.read_text(encoding="utf-8"), str(path), real_path=str(path))
    assert result.formatted is not None, result.diagnostics
    assert result.formatted == snapshot(extension_class=_Text)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_compile_to_the_same_graph(path: Path) -> None:
    """The fingerprint proof on real policies: the formatted example compiles identically."""
    source = path.read_text(encoding="utf-8")
    before, _ = parse_source(source, str(path))
    after, _ = parse_source(format_ast(before), str(path))
    base = str(path.parent)
    fingerprint = compile_in_memory(before, base)
    if path.name == "file-editor.sbpolicy" or "policies" in path.parts:
        assert isinstance(fingerprint, str)
    assert compile_in_memory(after, base) == fingerprint


def test_fingerprint_sees_a_change_in_meaning() -> None:
    """The fingerprint is position-free but not blind: changing a value changes it."""
    a, _ = parse_source('policy "p" version "1"\npermit fs.read paths ["/a"]\n', "p.sbpolicy")
    moved, _ = parse_source('policy "p" version "1"\n\n\n   permit fs.read paths ["/a"]\n',
                            "p.sbpolicy")
    b, _ = parse_source('policy "p" version "1"\npermit fs.read paths ["/b"]\n', "p.sbpolicy")
    assert compile_in_memory(a, ".") == compile_in_memory(moved, ".")
    assert compile_in_memory(a, ".") != compile_in_memory(b, ".")


def _drop_last_path(pf: ast.PolicyFile) -> str:
    """A deliberately broken printer: loses the last value of the first paths list."""
    text = format_ast(pf)
    return text.replace(', "/b"]', "]", 1)


def _bad_cel(pf: ast.PolicyFile) -> str:
    return format_ast(pf).replace("`true`", "`false`")


def _unparsable(pf: ast.PolicyFile) -> str:
    return format_ast(pf).replace("]", "", 1)


@pytest.mark.parametrize("render", [_drop_last_path, _bad_cel, _unparsable])
def test_soundness_refuses_a_broken_printer(render: Renderer) -> None:
    text = UGLY + "permit fs.write  paths [\"/w\"]  when `true`\n"
    result = format_source(text, "p.sbpolicy", render=render)
    assert result.formatted is None
    assert [d.id for d in result.diagnostics] == ["SBP420"]
    assert "p.sbpolicy" in result.diagnostics[0].message


def test_soundness_for_a_fragment_compares_the_ast() -> None:
    """A file without header that cannot compile alone is still proven by its AST."""
    text = 'permit fs.read paths ["/a", "/b"]\nforbid x.y paths []\n'
    assert format_source(text, "frag.sbpolicy").formatted is not None
    broken = format_source(text, "frag.sbpolicy", render=_drop_last_path)
    assert [d.id for d in broken.diagnostics] == ["SBP420"]


# ---- the command ----------------------------------------------------------------------------

def _tree(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    ugly = tmp_path / "sub" / "ugly.sbpolicy"
    ugly.write_text(UGLY)
    (tmp_path / "pretty.sbpolicy").write_text(PRETTY)
    (tmp_path / ".hidden" / "skip.sbpolicy").write_text(UGLY)
    (tmp_path / "notes.txt").write_text("not a policy")
    return ugly, tmp_path / "pretty.sbpolicy"


def test_check_lists_unformatted_files_with_a_diff(tmp_path: Path) -> None:
    ugly, _ = _tree(tmp_path)
    result = CliRunner().invoke(cli, ["fmt", "--check", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert f"would reformat {ugly}" in result.stderr
    assert f"--- {ugly} (original)" in result.stdout
    assert '-permit   fs.read paths ["/a",  "/b"]   # why' in result.stdout
    assert '+permit fs.read  paths ["/a", "/b"]  # why' in result.stdout
    assert "skip.sbpolicy" not in result.output
    assert ugly.read_text() == UGLY  # nothing written


def test_check_passes_on_formatted_files(tmp_path: Path) -> None:
    _, pretty = _tree(tmp_path)
    result = CliRunner().invoke(cli, ["fmt", "--check", str(pretty)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def test_diff_writes_nothing_and_exits_0(tmp_path: Path) -> None:
    ugly, _ = _tree(tmp_path)
    result = CliRunner().invoke(cli, ["fmt", "--diff", str(ugly)])
    assert result.exit_code == 0
    assert "+permit fs.read" in result.stdout
    assert ugly.read_text() == UGLY


def test_rewrites_in_place_keeping_the_mode(tmp_path: Path) -> None:
    ugly, pretty = _tree(tmp_path)
    ugly.chmod(0o640)
    before = pretty.stat().st_mtime_ns
    result = CliRunner().invoke(cli, ["fmt", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert ugly.read_text() == PRETTY
    assert stat.S_IMODE(ugly.stat().st_mode) == 0o640
    assert pretty.stat().st_mtime_ns == before  # formatted files are not rewritten
    assert "1 file(s) reformatted, 1 left unchanged" in result.stderr
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["ugly.sbpolicy"]


def test_stdin_to_stdout() -> None:
    result = CliRunner().invoke(cli, ["fmt", "-"], input=UGLY)
    assert result.exit_code == 0
    assert result.stdout == PRETTY


def test_syntax_error_exits_2_with_the_diagnostic(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sbpolicy"
    bad.write_text('policy "p" version "1"\npermit fs.read paths ["/a"\n')
    good = tmp_path / "good.sbpolicy"
    good.write_text(UGLY)
    result = CliRunner().invoke(cli, ["fmt", str(bad), str(good)])
    assert result.exit_code == 2
    assert f"{bad}:3:1: SBP103 unexpected end of file" in result.stderr
    assert "help:" in result.stderr
    assert "Traceback" not in result.output
    assert bad.read_text().endswith('["/a"\n')
    assert good.read_text() == PRETTY  # the usable file is still formatted


def test_missing_path_and_non_utf8_exit_2(tmp_path: Path) -> None:
    latin = tmp_path / "latin.sbpolicy"
    latin.write_bytes(b'policy "caf\xe9" version "1"\n')
    result = CliRunner().invoke(cli, ["fmt", str(tmp_path / "nope"), str(latin)])
    assert result.exit_code == 2
    assert "SBP100" in result.stderr
    assert "does not exist" in result.stderr
    assert "not UTF-8" in result.stderr


def test_write_failure_keeps_the_original(tmp_path: Path) -> None:
    target = tmp_path / "ro" / "p.sbpolicy"
    target.parent.mkdir()
    target.write_text(UGLY)
    target.parent.chmod(0o500)  # no new file (the temporary) can be created next to it
    try:
        if os.access(target.parent, os.W_OK):  # running as root: permissions do not bind
            problem = write_atomic(str(tmp_path / "missing-dir" / "p.sbpolicy"), PRETTY)
        else:
            problem = write_atomic(str(target), PRETTY)
    finally:
        target.parent.chmod(0o700)
    assert problem is not None
    assert problem.id == "SBP421"
    assert target.read_text() == UGLY
    assert [p.name for p in target.parent.iterdir()] == ["p.sbpolicy"]


def test_console_script_check(tmp_path: Path) -> None:
    """One real run of the installed `policy-engine` entry point."""
    ugly, _ = _tree(tmp_path)
    exe = shutil.which("policy-engine") or str(Path(sys.executable).parent / "policy-engine")
    proc = subprocess.run([exe, "fmt", "--check", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"would reformat {ugly}" in proc.stderr
    assert "+permit fs.read  paths" in proc.stdout
    fixed = subprocess.run([exe, "fmt", str(ugly)], capture_output=True, text=True,
                           timeout=120, check=False)
    assert fixed.returncode == 0, fixed.stderr
    again = subprocess.run([exe, "fmt", "--check", str(ugly)], capture_output=True,
                           text=True, timeout=120, check=False)
    assert again.returncode == 0
    assert again.stdout == ""
