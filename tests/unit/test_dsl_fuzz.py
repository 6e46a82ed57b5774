"""Never a traceback for bad input: malformed policies only ever produce Diagnostics."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_engine.compiler import check_files
from policy_engine.dsl.render import render_diagnostic
from policy_engine.errors import Diagnostic, Severity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"
ORG = (FIXTURES / "org.sbpolicy").read_text()

MALFORMED = [
    "", "\n\n", "policy", 'policy "', 'policy "a" version "1" policy',
    "{}", "[]", "permit", "permit fs.read paths", "permit fs.read paths [",
    "permit fs.read paths [,]", 'permit fs.read paths ["/a",,]', "forbid mandatory",
    "permit proc.exec tool", 'permit proc.exec tool "g" args [|]',
    'permit proc.exec tool "g" args ["a" | ]', 'permit proc.exec tool "g" args [...]',
    "permit sys.gpu class", "permit tmp.use max_bytes -1", "permit tmp.use max_bytes 1e9",
    "defaults { limits { cpu } }", "defaults { limits { cpu 1 2 } }", "defaults { network }",
    "require", "require consent when", "require consent when ``", "require consent when `(`",
    'profile "x" { fs }', 'profile { }', 'tool "t" { }', 'tool "t" version "1" { permit }',
    'tool "t" version "1" { forbid fs.read paths ["/a"] }', "import", 'import ""',
    'import "/"', 'import "."', "`", '"', "/", "//", "#", "\\", "\t\r\n", "\ufeffpolicy",
    "permit fs.read paths [\"\\u12\"]", "permit net.http hosts [\"\"] ports [0]",
    "permit net.http hosts [\"a.com\"] ports [99999999999999999999999]",
    "defaults { limits { memory 99999999999999999999GiB } }",
    "defaults { timeout 1.5.5s }", "permit fs.read paths [\"/a\"] when `" + "(" * 500 + "`",
    "policy \"x\" version \"1\"\n" + "permit fs.read paths [\"/a\"]\n" * 200,
    ORG.replace("}", ""), ORG.replace("]", ""), ORG.replace('"', ""), ORG[: len(ORG) // 2],
]


def _run(tmp: Path, text: str | bytes) -> list[Diagnostic]:
    path = tmp / "fuzz.sbpolicy"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    diags = check_files([path], home="/home/u")
    for d in diags:
        assert isinstance(d, Diagnostic)
        assert d.id.startswith("SBP")
        assert d.message
        render_diagnostic(d)  # rendering never fails either
    return diags


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_inputs_give_diagnostics(tmp_path: Path, text: str) -> None:
    diags = _run(tmp_path, text)
    if text.strip() and not text.startswith("policy \"x\""):
        assert any(d.severity is Severity.ERROR for d in diags)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_random_text_never_raises(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _run(Path(tmp), text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _run(Path(tmp), data)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(ORG)), st.integers(0, 40),
       st.text(alphabet='{}[]",|/`#.~*\n abc0123456789', max_size=8))
def test_mutated_fixture_never_raises(start: int, length: int, insert: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "common").mkdir()
        (root / "common" / "network.sbpolicy").write_text(
            (FIXTURES / "common" / "network.sbpolicy").read_text())
        _run(root, ORG[:start] + insert + ORG[start + length:])


def test_missing_and_directory_paths(tmp_path: Path) -> None:
    assert [d.id for d in check_files([tmp_path / "nope.sbpolicy"])] == ["SBP100"]
    assert [d.id for d in check_files([tmp_path])] == ["SBP100"]
    assert [d.id for d in check_files([])] == ["SBP100"]
