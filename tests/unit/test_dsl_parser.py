"""Parser and AST: every construct parses, nodes carry spans, syntax errors become SBP1xx."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from policy_engine.dsl import ast
from policy_engine.dsl.grammar import get_parser
from policy_engine.dsl.parser import parse_file, parse_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"

ALL_CONSTRUCTS = """\
policy "acme/agents" version "1.4.0"   # header
import "common/net.sbpolicy"
defaults {
  timeout 60s
  network restricted
  limits { bytes_in 10MiB bytes_out 1MiB files 100 depth 3 concurrency 4 cpu 1 memory 512MiB
           pids 64 stdout 1MiB stderr 1MiB screenshot 1920x1080 timeout 30s }
}
forbid mandatory fs.read, fs.write paths ["~/.kube/**"]
permit "read-workspace" fs.read paths ["/workspace/**"]
permit net.http hosts ["api.github.com", "*.github.com", "10.0.0.0/8"] ports [443]
  schemes ["https"] methods ["GET","HEAD"] mime ["application/json"]
permit browser.use hosts ["docs.python.org"] scopes [open, extract, screenshot]
permit proc.exec tool "git" args ["status" | "log" | /^--(oneline|stat)$/, "x" ...]
  limits { cpu 0.5 }
permit tmp.use max_bytes 64MiB
permit sys.gpu class "a100" when `tenant.tier == "gpu"`
require consent when `profile.safety == "High"`
require consent
profile "safe-readonly" { network off  fs read-only  writable ["/workspace/work/**"]
  timeout 10s  limits { memory 256MiB } }
tool "git-helper" version "1.0" {
  description "inspect"
  permit proc.exec tool "git" args ["status"]
  side_effects [Read, Write]
  safety High
  network off
  profile "workspace-write"
  limits { cpu 1 }
  timeout 5s
}
// trailing comment
"""


def _parse(text: str) -> list[ast.Item]:
    pf, diags = parse_source(text, "t.sbpolicy")
    assert diags == []
    return pf.items


def test_every_construct_parses_into_its_node() -> None:
    items = _parse(ALL_CONSTRUCTS)
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["Header", "Import", "Defaults", "Rule", "Rule", "Rule", "Rule", "Rule",
                     "Rule", "Rule", "Consent", "Consent", "ProfileDef", "ToolDef"]
    header, imp, defaults = items[0], items[1], items[2]
    assert isinstance(header, ast.Header)
    assert header.name.value == "acme/agents"
    assert header.version.value == "1.4.0"
    assert isinstance(imp, ast.Import)
    assert imp.path.value == "common/net.sbpolicy"
    assert isinstance(defaults, ast.Defaults)
    assert [s.key for s in defaults.settings] == ["timeout", "network"]
    names = [lim.name.value for lim in defaults.limits[0].items]
    assert names[-2:] == ["screenshot", "timeout"]
    assert len(names) == 12


def test_rule_shapes() -> None:
    items = _parse(ALL_CONSTRUCTS)
    mandatory, named, net, browser, proc, tmp, gpu = items[3:10]
    assert isinstance(mandatory, ast.Rule)
    assert mandatory.mandatory
    assert [k.value for k in mandatory.kinds] == ["fs.read", "fs.write"]
    assert isinstance(named, ast.Rule)
    assert named.name is not None
    assert named.name.value == "read-workspace"
    assert named.effect == "permit"
    assert isinstance(net, ast.Rule)
    assert [c.name for c in net.clauses if isinstance(c, ast.Resource)] == [
        "hosts", "ports", "schemes", "methods", "mime"]
    assert isinstance(browser, ast.Rule)
    scopes = browser.clauses[1]
    assert isinstance(scopes, ast.Resource)
    assert [v.value for v in scopes.values if isinstance(v, ast.Word)] == [
        "open", "extract", "screenshot"]
    assert isinstance(proc, ast.Rule)
    tool = proc.clauses[0]
    assert isinstance(tool, ast.ToolClause)
    assert tool.args is not None
    first, second = tool.args
    assert [a.literal for a in first.alternatives] == ["status", "log", None]
    assert first.alternatives[2].regex == "^--(oneline|stat)$"
    assert not first.repeat
    assert second.repeat
    assert second.alternatives[0].literal == "x"
    assert isinstance(proc.clauses[1], ast.LimitsBlock)
    assert isinstance(tmp, ast.Rule)
    assert isinstance(tmp.clauses[0], ast.Scalar)
    assert isinstance(gpu, ast.Rule)
    assert isinstance(gpu.clauses[1], ast.Cel)
    assert gpu.clauses[1].source == 'tenant.tier == "gpu"'


def test_consent_profile_and_tool_blocks() -> None:
    items = _parse(ALL_CONSTRUCTS)
    when, always, profile, tool = items[10:]
    assert isinstance(when, ast.Consent)
    assert when.condition is not None
    assert isinstance(always, ast.Consent)
    assert always.condition is None
    assert isinstance(profile, ast.ProfileDef)
    assert [s.key for s in profile.settings] == ["network", "fs", "writable", "timeout"]
    assert isinstance(tool, ast.ToolDef)
    assert tool.name.value == "git-helper"
    assert len(tool.permits) == 1
    assert tool.version.value == "1.0"
    assert [s.key for s in tool.settings] == [
        "description", "side_effects", "safety", "network", "profile", "timeout"]


def test_nodes_carry_file_line_and_column() -> None:
    text = 'policy "p" version "1"\n\n  permit fs.read paths ["/a/**"]\n    when `true`\n'
    pf, diags = parse_source(text, "dir/p.sbpolicy")
    assert diags == []
    rule = pf.items[1]
    assert isinstance(rule, ast.Rule)
    assert (rule.span.file, rule.span.line, rule.span.column) == ("dir/p.sbpolicy", 3, 3)
    assert (rule.span.end_line, rule.span.end_column) == (4, 16)
    res = rule.clauses[0]
    assert isinstance(res, ast.Resource)
    assert (res.span.line, res.span.column) == (3, 18)
    assert (res.values[0].span.line, res.values[0].span.column) == (3, 25)
    cel = rule.clauses[1]
    assert isinstance(cel, ast.Cel)
    assert (cel.span.line, cel.span.column) == (4, 10)


def test_string_escapes_and_regex_slashes() -> None:
    items = _parse('permit proc.exec tool "a\\"b\\u0041" args [/x\\/y/]')
    rule = items[0]
    assert isinstance(rule, ast.Rule)
    clause = rule.clauses[0]
    assert isinstance(clause, ast.ToolClause)
    assert clause.args is not None
    assert clause.tool.value == 'a"bA'
    assert clause.args[0].alternatives[0].regex == "x/y"


def test_keyword_is_a_plain_word_where_the_parser_expects_one() -> None:
    # `timeout` is a statement keyword and also a limit name: the contextual lexer tells them
    items = _parse("defaults { timeout 1s limits { timeout 2s } }")
    defaults = items[0]
    assert isinstance(defaults, ast.Defaults)
    assert defaults.limits[0].items[0].name.value == "timeout"


def test_tool_clause_after_a_rule_without_clauses_is_not_a_tool_block() -> None:
    items = _parse('permit sys.gpu\ntool "t" version "1" { safety Low }\n'
                   'permit proc.exec tool "git"')
    assert [type(i).__name__ for i in items] == ["Rule", "ToolDef", "Rule"]


@pytest.mark.parametrize(("text", "code", "line", "column"), [
    ('policy "p" version "1"\npermit fs.read paths ["/a/**"] ]', "SBP101", 2, 32),
    ("permit fs.read paths [@]", "SBP102", 1, 23),
    ('permit fs.read paths ["/a/**"', "SBP103", 1, 30),
    ('defaults {\n  timeout 1s\n', "SBP103", 3, 1),
    ('permit fs.read paths ["/a/**', "SBP104", 1, 23),
    ("permit fs.read paths [] when `true", "SBP104", 1, 30),
    ('permit proc.exec tool "g" args [/abc', "SBP104", 1, 33),
    ('permit fs.read paths ["\\q"]', "SBP104", 1, 24),
    ("allow fs.read", "SBP101", 1, 1),
    ("permit fs.read\n\x00", "SBP102", 2, 1),
])
def test_syntax_errors_have_codes_and_positions(
    text: str, code: str, line: int, column: int,
) -> None:
    _, diags = parse_source(text, "t.sbpolicy")
    assert len(diags) == 1
    d = diags[0]
    assert d.id == code
    assert d.span is not None
    assert (d.span.line, d.span.column) == (line, column)
    assert d.message[0].islower()
    assert not d.message.endswith(".")


def test_unexpected_token_names_what_was_expected() -> None:
    _, diags = parse_source("network off", "t.sbpolicy")
    assert diags[0].id == "SBP101"
    assert "`network`" in diags[0].message
    assert "`permit`" in diags[0].message


def test_unreadable_files(tmp_path: Path) -> None:
    _, missing = parse_file(tmp_path / "nope.sbpolicy")
    assert missing[0].id == "SBP100"
    assert "does not exist" in missing[0].message
    _, directory = parse_file(tmp_path)
    assert directory[0].id == "SBP100"
    bad = tmp_path / "latin1.sbpolicy"
    bad.write_bytes(b'policy "caf\xe9" version "1"\n')
    _, enc = parse_file(bad)
    assert enc[0].id == "SBP100"
    assert "UTF-8" in enc[0].message
    assert enc[0].span is not None
    assert (enc[0].span.line, enc[0].span.column) == (1, 12)


def test_fixture_policy_parses_fast() -> None:
    text = (FIXTURES / "org.sbpolicy").read_text()
    get_parser()  # the grammar is built once and cached
    start = time.perf_counter()
    for _ in range(20):
        _, diags = parse_source(text, "org.sbpolicy")
    per_parse = (time.perf_counter() - start) / 20
    assert diags == []
    assert per_parse < 0.010
    assert get_parser() is get_parser()


def test_comments_are_collected_in_order_with_spans() -> None:
    text = (
        '# head\npolicy "p" version "1"  // trailing\n'
        'permit "r" fs.read paths ["/w/**"]  # sbpolicy: ignore SBP301 reason="x"\n'
        'permit "s" fs.read paths ["/a#b"]\n'
    )
    pf, diags = parse_source(text, "c.sbpolicy")
    assert diags == []
    assert [(c.text, c.span.line, c.span.column) for c in pf.comments] == [
        ("# head", 1, 1),
        ("// trailing", 2, 25),
        ('# sbpolicy: ignore SBP301 reason="x"', 3, 37),
    ]


def test_comments_do_not_leak_between_parses() -> None:
    first, _ = parse_source("# one\n", "a.sbpolicy")
    second, _ = parse_source('policy "p" version "1"\n', "b.sbpolicy")
    assert [c.text for c in first.comments] == ["# one"]
    assert second.comments == []
