"""The language server's incremental view of a large buffer: statements, re-parsing only what
changed, and carrying the last full analysis over to the lines its findings moved to."""

from __future__ import annotations

import sys
from pathlib import Path

from policy_engine.lsp import analysis, incremental

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from scale_policy import scale_policy  # noqa: E402

PATH = "/tmp/incremental-test.sbpolicy"
BLOCKS = '''policy "t/p" version "1"
defaults {
  timeout 30s
}
# a comment with a brace {
tool "x" version "1" {
permit fs.read paths ["/w/**"]
  permit proc.exec tool "ls" when `request.args.size() < 2 && "{" != ""`
}
permit "after" fs.read paths ["/a/**"]  // trailing } comment
forbid fs.read paths ["/a/secret/**"]
'''


def test_statements_cut_at_top_level_keywords_only() -> None:
    parts = incremental.chunks(BLOCKS)
    assert "".join(p.text for p in parts) == BLOCKS
    firsts = [p.text.split("\n", 1)[0] for p in parts]
    # the unindented permit inside the tool block is not a statement of its own
    assert firsts == ['policy "t/p" version "1"', "defaults {", 'tool "x" version "1" {',
                      'permit "after" fs.read paths ["/a/**"]  // trailing } comment',
                      'forbid fs.read paths ["/a/secret/**"]']
    assert [p.start for p in parts] == [1, 2, 6, 10, 11]


def test_a_syntax_error_is_found_in_the_changed_statement_at_its_line() -> None:
    text = scale_policy(400).sbpolicy
    snap = incremental.Snapshot.of(text, PATH, analysis.diagnostics(text, PATH))
    rows = text.split("\n")
    line = 201  # 0-based row of a rule
    rows[line] = rows[line].replace("]", "", 1) if "]" in rows[line] else rows[line] + " ["
    broken = "\n".join(rows)
    found = incremental.diagnostics(broken, PATH, snap)
    syntax = [d for d in found if d.id.startswith("SBP1")]
    assert syntax, found
    assert syntax[0].span is not None
    assert syntax[0].span.line in (line + 1, line + 2)  # the statement's row or the next
    # the full analysis finds it at the same place (it words the end of the statement as the
    # next token, the statement alone as the end of its text)
    full = [d for d in analysis.diagnostics(broken, PATH) if d.id.startswith("SBP1")]
    assert [d.span.line for d in full if d.span is not None] == [syntax[0].span.line]


def test_findings_of_unchanged_statements_move_with_their_lines() -> None:
    text = scale_policy(300).sbpolicy
    full = analysis.diagnostics(text, PATH)
    assert len(full) > 50  # the generated policy has lint findings to carry
    snap = incremental.Snapshot.of(text, PATH, full)
    header, rest = text.split("\n", 1)
    inserted = header + "\n# two lines\n# of comment\n" + rest
    carried = incremental.diagnostics(inserted, PATH, snap)
    fresh = analysis.diagnostics(inserted, PATH)
    # the comments belong to the header's statement (changed): nothing else is re-analysed,
    # and every finding lands where a full analysis puts it
    key = sorted((d.id, d.span.line if d.span else 0, d.message) for d in fresh)
    assert sorted((d.id, d.span.line if d.span else 0, d.message) for d in carried) == key


def test_a_changed_statement_drops_its_old_findings_until_the_full_analysis() -> None:
    text = scale_policy(300).sbpolicy
    full = analysis.diagnostics(text, PATH)
    snap = incremental.Snapshot.of(text, PATH, full)
    target = next(d for d in full if d.span is not None and d.span.line > 10)
    assert target.span is not None
    rows = text.split("\n")
    rows[target.span.line - 1] += "  # edited"
    carried = incremental.diagnostics("\n".join(rows), PATH, snap)
    lines = {d.span.line for d in carried if d.span is not None}
    assert target.span.line not in lines
    assert len(carried) == len(full) - sum(
        1 for d in full if d.span is not None and d.span.line == target.span.line)
