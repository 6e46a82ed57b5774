"""Every lint rule fires on its bad fixture (ID, line, column) and not on its good one; the
shipped examples give exactly their real findings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policy_engine.lint import CATALOGUE, LintConfig, lint_paths
from policy_engine.lint.psl import public_suffix
from policy_engine.lint.rules.process import interpreter

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "lint"
EXPECT = re.compile(r"^# expect: (SBP\d{3}) at (\d+):(\d+)$", re.MULTILINE)
IDS = [r.id for r in CATALOGUE]


def _found(path: Path, rule_id: str) -> set[tuple[str, int, int]]:
    result = lint_paths([str(path)], jobs=1)
    assert result.unusable == []
    return {(f.id, f.span.line, f.span.column) for f in result.active()
            if f.id == rule_id and f.span is not None}


@pytest.mark.parametrize("rule_id", IDS)
def test_bad_fixture_triggers_the_rule_at_the_expected_position(rule_id: str) -> None:
    bad = DATA / rule_id / "bad.sbpolicy"
    expected = {(i, int(line), int(col)) for i, line, col in EXPECT.findall(bad.read_text())}
    assert expected, f"{bad} declares no `# expect:` line"
    assert _found(bad, rule_id) == expected


@pytest.mark.parametrize("rule_id", IDS)
def test_good_fixture_does_not_trigger_the_rule(rule_id: str) -> None:
    assert _found(DATA / rule_id / "good.sbpolicy", rule_id) == set()


def test_every_catalogue_rule_has_fixtures() -> None:
    assert sorted(p.name for p in DATA.iterdir() if p.is_dir()) == sorted(IDS)
    assert len(IDS) >= 15


def test_examples_are_clean_with_three_reasoned_suppressions() -> None:
    result = lint_paths([str(ROOT / "examples" / "policies"),
                         str(ROOT / "examples" / "manifests" / "file-editor.sbpolicy")], jobs=1)
    assert result.active() == []
    # `*` hosts for public pages, plain http to the LAN mirror and GitHub's content suffix
    # are deliberate, and say why
    suppressed = {(Path(f.span.file).name, f.id) for f in result.findings
                  if f.span and f.suppressed is not None}
    assert suppressed == {("network.sbpolicy", "SBP301"), ("network.sbpolicy", "SBP320"),
                          ("network.sbpolicy", "SBP302")}
    assert result.unusable == []


def write(tmp_path: Path, body: str, name: str = "p.sbpolicy") -> Path:
    p = tmp_path / name
    p.write_text('policy "t/p" version "1"\ndefaults { timeout 60s }\n' + body)
    return p


def ids(path: Path, **kw: object) -> list[tuple[str, int]]:
    result = lint_paths([str(path)], LintConfig(**kw), jobs=1)  # type: ignore[arg-type]
    return [(f.id, f.span.line) for f in result.active() if f.span]


@pytest.mark.parametrize(("args", "fires"), [
    ('["-m", "pytest", /.*/ ...]', False),      # after -m everything belongs to the module
    ('["-c", "print(1)"]', True),
    ('[/-[A-Z]+/, "-c", /.*/]', True),          # -c still reachable after an option slot
    ('["script.py", "-c"]', False),             # after the script: the script's own argument
    ('[/.*/ ...]', True),
    ('["-Ic", /.*/]', True),                     # combined short options
])
def test_python_inline_code_respects_where_options_end(tmp_path: Path, args: str,
                                                       fires: bool) -> None:
    p = write(tmp_path, f'permit proc.exec tool "/usr/bin/python3.11" args {args}\n')
    assert (("SBP311", 3) in ids(p)) is fires


def test_interpreter_names() -> None:
    assert interpreter("python3")
    assert interpreter("/usr/bin/node")
    assert interpreter("perl5.36")
    assert interpreter("git") is None
    assert interpreter("pythonic") is None


@pytest.mark.parametrize("tool", ["bash", "/bin/sh", "env", "xargs", "busybox"])
def test_shells_and_launchers(tmp_path: Path, tool: str) -> None:
    p = write(tmp_path, f'permit proc.exec tool "{tool}" args ["x"]\n')
    assert ids(p) == [("SBP310", 3)]


def test_shell_in_a_tool_block_is_found_too(tmp_path: Path) -> None:
    p = write(tmp_path, 'tool "t" version "1" {\n  permit proc.exec tool "zsh" args ["-c"]\n}\n')
    assert ids(p) == [("SBP310", 4)]


def test_public_suffixes() -> None:
    assert public_suffix("com")
    assert public_suffix("co.uk")
    assert public_suffix("github.io")
    assert public_suffix("example.com") is None
    # the full list (publicsuffixlist): private suffixes where anyone gets a subdomain
    assert public_suffix("r2.dev") == "a hosting suffix where anyone can get a subdomain"
    assert public_suffix("pythonanywhere.com") is not None
    assert public_suffix("githubusercontent.com") is not None
    assert public_suffix("co.uk") == "a public suffix"
    assert public_suffix("raw.githubusercontent.com") is None
    assert public_suffix("bucket.r2.dev") is None


def test_shadowing_is_sound(tmp_path: Path) -> None:
    p = write(tmp_path, "\n".join([
        'permit "wide" fs.read paths ["/workspace/**"] when `grant.tenant == "a"`',
        'permit "narrow" fs.read paths ["/workspace/src/**"]',   # earlier one is conditional
        'permit "other" fs.read paths ["/workspace-other/**"]',  # a sibling, not beneath
        'forbid "no-git" proc.exec tool "git" args ["push"]',
        'permit "git" proc.exec tool "git" args ["status"]',      # different argv: reachable
        'permit "net-a" net.http hosts ["*.example.com"] methods ["GET"]',
        'permit "net-b" net.http hosts ["api.example.com"] methods ["GET", "POST"]',
        "",
    ]))
    assert [i for i, _ in ids(p) if i in ("SBP338", "SBP339")] == []


def test_shadowing_across_kinds_and_hosts(tmp_path: Path) -> None:
    p = write(tmp_path, "\n".join([
        'permit "net-a" net.http hosts ["*.example.com"] methods ["GET", "POST"]',
        'permit "net-b" net.http hosts ["api.example.com"] methods ["POST"]',
        'forbid "no-x" proc.exec tool "x"',
        'permit "x" proc.exec tool "x" args ["a"]',
        "",
    ]))
    assert [(i, line) for i, line in ids(p) if i in ("SBP338", "SBP339")] == [
        ("SBP339", 4), ("SBP338", 6)]


def test_limit_above_default_covers_profiles_and_tools(tmp_path: Path) -> None:
    p = write(tmp_path, 'profile "ci" { timeout 2m }\n'
              'tool "t" version "1" {\n  permit fs.read paths ["/w/**"]\n  profile "ci"\n'
              '  limits { timeout 90s }\n}\n')
    assert ids(p) == [("SBP331", 3), ("SBP331", 7)]


def test_select_and_ignore(tmp_path: Path) -> None:
    p = write(tmp_path, 'permit net.http hosts ["*"] schemes ["http"]\n')
    assert {i for i, _ in ids(p)} == {"SBP301", "SBP320"}
    assert {i for i, _ in ids(p, select=frozenset({"SBP320"}))} == {"SBP320"}
    assert {i for i, _ in ids(p, ignore=frozenset({"SBP320"}))} == {"SBP301"}
