"""Diagnostic rendering and the grammar shipped inside the wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from policy_engine.dsl.grammar import grammar_text
from policy_engine.dsl.render import render_diagnostic, render_diagnostics
from policy_engine.errors import Diagnostic, Span

ROOT = Path(__file__).resolve().parents[2]


def test_render_has_location_source_caret_and_help(tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text('policy "p" version "1"\npermit fs.read hosts ["a.com"]\n')
    d = Diagnostic.make("SBP212", "`hosts` is not a resource of `fs.read`",
                        Span(str(p), 2, 16, 2, 31))
    assert render_diagnostic(d).split("\n") == [
        f"{p}:2:16: SBP212 `hosts` is not a resource of `fs.read`",
        'permit fs.read hosts ["a.com"]',
        "               " + "^" * 15,
        "  help: each capability takes only its own resources; see docs/language.md",
    ]


def test_render_with_given_source_tabs_and_color() -> None:
    d = Diagnostic.make("SBP102", "unexpected character `@`", Span("x.sbpolicy", 1, 3))
    text = render_diagnostic(d, source="\t @x\n", color=True)
    lines = text.split("\n")
    assert "\x1b[" in lines[0]
    assert lines[1] == "\t @x"
    assert "\t ^" in lines[2]


def test_render_without_span_or_source() -> None:
    d = Diagnostic.make("SBP100", "no policy files given", None)
    assert render_diagnostic(d).split("\n")[0] == "SBP100 no policy files given"
    gone = Diagnostic.make("SBP101", "unexpected `x`", Span("/nonexistent/p.sbpolicy", 4, 2))
    assert render_diagnostic(gone).split("\n")[:2] == [
        "/nonexistent/p.sbpolicy:4:2: SBP101 unexpected `x`", "  help: check the statement "
        "against the language reference (docs/language.md)"]
    assert render_diagnostics([d, d]).count("SBP100") == 2


def test_grammar_symlink_points_at_the_canonical_copy() -> None:
    link = ROOT / "policy_engine" / "dsl" / "grammar" / "sbpolicy.lark"
    assert link.is_symlink()
    assert link.resolve() == (ROOT / "dsl" / "sbpolicy.lark").resolve()
    assert grammar_text() == (ROOT / "dsl" / "sbpolicy.lark").read_text()


def test_wheel_ships_the_grammar_and_every_data_file(tmp_path: Path) -> None:
    # build from a copy (symlinks kept as symlinks) so the checkout gets no build/ directory
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    # the guard's native probe (*.so) is left out: the wheel build must compile it itself
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so")
    for name in ("policy_engine", "plugins", "dsl"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        check=True, capture_output=True, cwd=tmp_path,
    )
    (wheel,) = out.glob("policy_engine-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = zf.read("policy_engine/dsl/grammar/sbpolicy.lark")
        names = set(zf.namelist())
    assert shipped == (ROOT / "dsl" / "sbpolicy.lark").read_bytes()
    # every non-Python file of the two packages (the native launcher's C source, py.typed …)
    # must be in the wheel: a plain `pip install .` has nothing else to read them from
    data = {str(p.relative_to(ROOT)) for pkg in ("policy_engine", "plugins")
            for p in (ROOT / pkg).rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts}
    assert data
    assert data - names == set()
