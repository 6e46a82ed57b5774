"""Inline suppressions: with a reason they hide a finding; without one, unused, unknown or
malformed they are findings themselves."""

from __future__ import annotations

from pathlib import Path

from policy_engine.lint import LintConfig, lint_paths

HEAD = 'policy "t/p" version "1"\ndefaults { timeout 60s }\n'


def run(tmp_path: Path, body: str, **kw: object) -> list[tuple[str, int, str | None]]:
    p = tmp_path / "p.sbpolicy"
    p.write_text(HEAD + body)
    result = lint_paths([str(p)], LintConfig(**kw), jobs=1)  # type: ignore[arg-type]
    assert result.unusable == []
    return [(f.id, f.span.line if f.span else 0, f.suppressed) for f in result.findings]


def test_comment_above_with_reason_suppresses(tmp_path: Path) -> None:
    assert run(tmp_path, '# sbpolicy: ignore SBP301 reason="crawler"\n'
               'permit net.http hosts ["*"]\n') == [("SBP301", 4, "crawler")]


def test_trailing_comment_covers_its_own_line(tmp_path: Path) -> None:
    assert run(tmp_path, 'permit net.http hosts ["*"]  // sbpolicy: ignore SBP301 reason="x"\n'
               ) == [("SBP301", 3, "x")]


def test_comment_above_covers_the_whole_statement(tmp_path: Path) -> None:
    body = ('# sbpolicy: ignore SBP320, SBP301 reason="lan"\n'
            '# another comment\n'
            'permit net.http\n  hosts ["*"]\n  schemes ["http"]\n')
    assert sorted(run(tmp_path, body)) == [("SBP301", 6, "lan"), ("SBP320", 7, "lan")]


def test_comment_two_lines_above_code_does_not_reach_further(tmp_path: Path) -> None:
    body = ('# sbpolicy: ignore SBP301 reason="x"\npermit fs.read paths ["/w/**"]\n'
            'permit net.http hosts ["*"]\n')
    assert run(tmp_path, body) == [("SBP347", 3, None), ("SBP301", 5, None)]


def test_without_reason_is_a_finding_and_not_honoured(tmp_path: Path) -> None:
    assert run(tmp_path, '# sbpolicy: ignore SBP301\npermit net.http hosts ["*"]\n') == [
        ("SBP346", 3, None), ("SBP301", 4, None)]
    assert run(tmp_path, '# sbpolicy: ignore SBP301 reason=""\npermit net.http hosts ["*"]\n'
               ) == [("SBP346", 3, None), ("SBP301", 4, None)]


def test_unused_suppression(tmp_path: Path) -> None:
    assert run(tmp_path, '# sbpolicy: ignore SBP301 reason="old"\n'
               'permit net.http hosts ["api.example.com"]\n') == [("SBP347", 3, None)]


def test_unused_is_not_reported_for_a_rule_turned_off(tmp_path: Path) -> None:
    body = '# sbpolicy: ignore SBP301 reason="x"\npermit net.http hosts ["*"]\n'
    assert run(tmp_path, body, ignore=frozenset({"SBP301"})) == []


def test_unknown_id_and_suppression_ids_cannot_be_suppressed(tmp_path: Path) -> None:
    body = ('# sbpolicy: ignore SBP399,SBP301,SBP216,SBP347 reason="x"\n'
            'permit net.http hosts ["*"]\n')
    got = run(tmp_path, body)
    assert ("SBP301", 4, "x") in got
    assert sorted(f for f in got if f[0] == "SBP348") == [("SBP348", 3, None)] * 3


def test_malformed_suppression(tmp_path: Path) -> None:
    assert run(tmp_path, '# sbpolicy: ignroe SBP301\npermit fs.read paths ["/w/**"]\n') == [
        ("SBP345", 3, None)]


def test_ordinary_comments_are_left_alone(tmp_path: Path) -> None:
    assert run(tmp_path, '# ignore SBP301 reason="not a suppression"\n'
               'permit fs.read paths ["/w/**"]\n') == []
