"""Every SBP2xx check: the right ID at the right file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_engine.compiler import check_files
from policy_engine.errors import Diagnostic, Severity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"
HEADER = 'policy "p" version "1"\n'


def _check(tmp_path: Path, body: str, *, header: bool = True) -> list[Diagnostic]:
    p = tmp_path / "p.sbpolicy"
    p.write_text((HEADER if header else "") + body)
    return check_files([p], home="/home/u")


def _only(diags: list[Diagnostic]) -> Diagnostic:
    assert len(diags) == 1, diags
    d = diags[0]
    assert not d.message[0].isupper()
    assert not d.message.endswith(".")
    assert d.help
    return d


@pytest.mark.parametrize(("body", "code", "line", "column", "needle"), [
    ('permit "r" fs.read paths ["/a/**"]\npermit "r" fs.list paths ["/b/**"]',
     "SBP201", 3, 8, "rule `r`"),
    ('profile "x" { network off }\nprofile "x" { network on }', "SBP201", 3, 9, "profile `x`"),
    ('tool "t" version "1" { safety Low }\ntool "t" version "2" { safety Low }',
     "SBP201", 3, 6, "tool `t`"),
    ("defaults { limits { pids 1 pids 2 } }", "SBP201", 2, 28, "limit `pids`"),
    ('permit fs.read paths ["/a/**"] paths ["/b/**"]', "SBP201", 2, 32, "`paths` given twice"),
    ('tool "t" version "1" { profile "nope" }', "SBP202", 2, 32, "profile `nope`"),
    ('import "missing.sbpolicy"', "SBP204", 2, 8, "missing.sbpolicy"),
    ("defaults { timeout 60 }", "SBP205", 2, 20, "needs a unit"),
    ("defaults { limits { memory 5XB } }", "SBP205", 2, 28, "unknown size unit `XB`"),
    ("permit tmp.use max_bytes 1Kib", "SBP205", 2, 26, "`Kib`"),
    ('permit fs.read paths ["relative/x"]', "SBP206", 2, 23, "must be absolute"),
    ('permit fs.read paths ["/a/**b"]', "SBP206", 2, 23, "whole segment"),
    ('permit net.http hosts ["a.*.com"]', "SBP207", 2, 24, "a.*.com"),
    ('permit net.http hosts ["10.0.0.0/33"]', "SBP207", 2, 24, "CIDR"),
    ('permit proc.exec tool "git" args [/(unclosed/]', "SBP208", 2, 35, "invalid regex"),
    ("permit fs.read paths [\"/a\"] when `1 +`", "SBP209", 2, 38, "syntax"),
    ("permit fs.read paths [\"/a\"] when `nosuch.x`", "SBP210", 2, 41, "nosuch.x"),
    ("permit fs.read paths [\"/a\"] when `request.size + 1`", "SBP211", 2, 35, "`int`"),
    ('permit fs.read hosts ["a.com"] paths ["/a/**"]', "SBP212", 2, 16, "`hosts`"),
    ("forbid fs.read paths [\"/a\"] limits { pids 1 }", "SBP212", 2, 29, "`limits`"),
    ("defaults { network sometimes }", "SBP213", 2, 20, "network mode `sometimes`"),
    ("defaults { limits { bogus 1 } }", "SBP213", 2, 21, "unknown limit `bogus`"),
    ("defaults { limits { concurrency 0 } }", "SBP213", 2, 21, "concurrency"),
    ("permit fs.read", "SBP213", 2, 1, "needs `paths`"),
    ("permit net.http hosts [\"a.com\"] ports [70000]", "SBP213", 2, 40, "70000"),
    ("permit net.http hosts [\"a.com\"] methods [\"FETCH\"]", "SBP213", 2, 42, "FETCH"),
    ("permit browser.use hosts [\"a.com\"] scopes [click]", "SBP213", 2, 44, "click"),
    ("permit mandatory fs.read paths [\"/a\"]", "SBP213", 2, 1, "mandatory"),
    ('profile "x" { fs read-mostly }', "SBP213", 2, 18, "read-mostly"),
    ('tool "t" version "1" { safety Extreme }', "SBP213", 2, 31, "Extreme"),
    ("permit fs.raed paths [\"/a\"]", "SBP214", 2, 8, "`fs.raed`"),
    ('policy "q" version "2"', "SBP215", 2, 1, "second `policy` header"),
])
def test_check(tmp_path: Path, body: str, code: str, line: int, column: int,
               needle: str) -> None:
    d = _only(_check(tmp_path, body))
    assert d.id == code, d
    assert d.span is not None
    assert (d.span.line, d.span.column) == (line, column), d
    assert needle in d.message


def test_missing_header(tmp_path: Path) -> None:
    d = _only(_check(tmp_path, 'permit fs.read paths ["/a/**"]\n', header=False))
    assert d.id == "SBP200"
    assert d.span is not None
    assert d.span.line == 1


def test_conflicting_headers_of_files_compiled_together(tmp_path: Path) -> None:
    a, b = tmp_path / "a.sbpolicy", tmp_path / "b.sbpolicy"
    a.write_text('policy "p" version "1"\n')
    b.write_text('policy "p" version "2"\n')
    d = _only(check_files([a, b]))
    assert d.id == "SBP215"
    assert d.span is not None
    assert d.span.file == str(b)


def test_import_cycle_names_the_cycle() -> None:
    d = _only(check_files([FIXTURES / "cycle" / "a.sbpolicy"]))
    assert d.id == "SBP203"
    assert d.span is not None
    assert d.span.file.endswith("c.sbpolicy")
    assert (d.span.line, d.span.column) == (1, 8)
    for name in ("a.sbpolicy", "b.sbpolicy", "c.sbpolicy"):
        assert name in d.message
    assert d.message.count("a.sbpolicy") == 2


def test_imports_are_relative_to_the_importing_file(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.sbpolicy").write_text('import "y.sbpolicy"\n')
    (tmp_path / "lib" / "y.sbpolicy").write_text('permit fs.read paths ["/y/**"]\n')
    assert _check(tmp_path, 'import "lib/x.sbpolicy"\n') == []


def test_cel_error_is_positioned_in_the_policy_file(tmp_path: Path) -> None:
    body = ('permit fs.write paths ["/w/**"]\n'
            '  when `grant.subject_id.startsWith("agent:") &&\n'
            '        request.size + "x" > 3`\n')
    d = _only(_check(tmp_path, body))
    assert d.id == "SBP210"
    assert d.span is not None
    # `dyn + string` is a string; `string > int` has no overload: the `>` is on the
    # condition's second line (file line 4), column 28 of that line
    assert (d.span.line, d.span.column) == (4, 28)
    assert "_>_" in d.message


def test_shadowed_permit_is_a_warning(tmp_path: Path) -> None:
    d = _only(_check(tmp_path, 'permit fs.read paths ["~/.ssh/id_ed25519", "~/.aws/**"]\n'))
    assert d.id == "SBP216"
    assert d.severity is Severity.WARNING


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    diags = _check(tmp_path, 'permit fs.read paths ["x"]\npermit net.http hosts ["*x"]\n'
                             "permit fs.list paths [\"/a\"] when `1`\n")
    assert [d.id for d in diags] == ["SBP206", "SBP207", "SBP211"]
    assert [d.span.line for d in diags if d.span] == [2, 3, 4]


def test_clean_fixture_has_no_diagnostics() -> None:
    assert check_files([FIXTURES / "org.sbpolicy"]) == []
