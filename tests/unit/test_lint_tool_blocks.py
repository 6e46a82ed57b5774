"""Every lint rule that applies to a rule applies to a `tool` block's permits (issue 16)."""

from __future__ import annotations

from pathlib import Path

from policy_engine.lint import LintConfig, lint_paths

MANIFEST = """\
tool "shell" version "1.0" {
  permit fs.write paths ["/**"]
  permit proc.exec tool "git"
  permit proc.exec tool "ls" args [/.*/ ...]
  permit proc.exec tool "git" args ["status"]
  permit fs.read paths ["/workspace/**"]
}
"""

IN_A_POLICY = """\
policy "p" version "1"
defaults { timeout 10s }
forbid proc.exec tool "curl"
tool "t" version "1" {
  permit fs.read paths ["/w/**"]
  permit fs.read paths ["/w/**"]
  permit proc.exec tool "curl" args ["-s"]
  permit fs.read paths ["/v/**"]
}
"""


def _found(path: Path) -> list[tuple[str, int, int]]:
    result = lint_paths([str(path)], LintConfig(), jobs=1)
    assert result.unusable == []
    return sorted((f.id, f.span.line, f.span.column) for f in result.active() if f.span)


def test_a_tool_block_permit_is_held_to_the_secret_and_argument_rules(tmp_path: Path) -> None:
    path = tmp_path / "shell.sbpolicy"
    path.write_text(MANIFEST, encoding="utf-8")
    assert _found(path) == [
        ("SBP300", 2, 26),   # `/**` contains the mandatory denies (like a top-level permit)
        ("SBP303", 2, 26),   # and reaches secrets no mandatory deny covers
        ("SBP312", 3, 25),   # `git` with any arguments
        ("SBP312", 4, 36),   # `/.*/ ...` constrains nothing
        ("SBP339", 5, 3),    # `git status` adds nothing to `git` with any arguments
    ]


def test_the_same_permits_in_a_policy_give_the_same_rules(tmp_path: Path) -> None:
    # the reference: what the rules say about the permits written as top-level rules
    body = "".join(line.strip() + "\n" for line in MANIFEST.splitlines()[1:-1])
    path = tmp_path / "policy.sbpolicy"
    path.write_text('policy "p" version "1"\ndefaults { timeout 10s }\n' + body, encoding="utf-8")
    assert sorted({i for i, _l, _c in _found(path)}) == ["SBP300", "SBP303", "SBP312", "SBP339"]


def test_duplicate_and_forbidden_tool_permits(tmp_path: Path) -> None:
    path = tmp_path / "policy.sbpolicy"
    path.write_text(IN_A_POLICY, encoding="utf-8")
    assert _found(path) == [
        ("SBP337", 6, 3),    # the same permit twice in one block
        ("SBP338", 7, 3),    # the policy forbids every `curl`: the tool can never use it
    ]
