"""An unescaped `/` inside an argument regex: the help says to write `\\/`, with the fix."""

from __future__ import annotations

import pytest

from policy_engine.dsl.parser import parse_source

HEADER = 'policy "p" version "1"\n'


@pytest.mark.parametrize(("args", "diag_id", "fixed"), [
    ("[/src/.*/]", "SBP102", "/src\\/.*/"),          # the `.` after the early end
    ('[/a/b/, "x"]', "SBP101", "/a\\/b/"),           # a word after the early end
    ("[/^\\/usr/bin/.+$/]", "SBP101", "/^\\/usr\\/bin\\/.+$/"),  # already-escaped slash kept
])
def test_the_help_says_to_escape_the_slash(args: str, diag_id: str, fixed: str) -> None:
    _pf, diags = parse_source(HEADER + f'permit proc.exec tool "git" args {args}\n', "p.sbpolicy")
    assert len(diags) == 1, diags
    diag = diags[0]
    assert diag.id == diag_id
    assert diag.span is not None
    assert diag.span.line == 2
    assert diag.help is not None
    assert "`\\/`" in diag.help
    assert f"`{fixed}`" in diag.help


def test_other_stray_characters_keep_the_generic_help() -> None:
    _pf, diags = parse_source(HEADER + 'permit fs.read paths ["/x"] $\n', "p.sbpolicy")
    assert [d.id for d in diags] == ["SBP102"]
    assert diags[0].help is not None
    assert "\\/" not in diags[0].help
