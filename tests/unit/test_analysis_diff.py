"""The exact diff and `analyze` through the CLI: the changes sampling missed, and bad input.

Each regression case below was reported as "0 changed" by the sampled boundary diff (method,
host, regex) or is a kind of change a reviewer must see (path, limit, consent, forbid added or
removed); each must be found, with a witness both versions decide, and both deciding rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from policy_engine.analysis import automata
from policy_engine.analysis.difference import diff as exact_diff
from policy_engine.cli.main import cli
from policy_engine.compiler import compile_files
from policy_engine.lint import LintConfig, lint_paths

BASE = '''policy "t" version "1"
defaults { network on }
permit "read-ws" fs.read paths ["/workspace/**"] limits { bytes_in 1MiB }
permit "api" net.http hosts ["api.github.com"] ports [443] methods ["GET"]
permit "git" proc.exec tool "git" args ["status" | "log", /--(oneline|stat)/ ...]
'''
FORBID = 'forbid "no-log" proc.exec tool "git" args ["log", /.*/ ...]\n'


def run(tmp: Path, old: str, new: str, *extra: str) -> tuple[int, str]:
    (tmp / "old.sbpolicy").write_text(old)
    (tmp / "new.sbpolicy").write_text(new)
    result = CliRunner().invoke(cli, ["diff", str(tmp / "old.sbpolicy"),
                                      str(tmp / "new.sbpolicy"), *extra])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def changes(tmp: Path, old: str, new: str) -> list[dict[str, Any]]:
    code, out = run(tmp, old, new, "--format", "json")
    assert code == 1, out
    found: list[dict[str, Any]] = json.loads(out)["exact"]["changes"]
    assert found
    return found


@pytest.mark.parametrize(("name", "before", "after", "op", "new_rule"), [
    ("method", 'methods ["GET"]', 'methods ["GET", "POST"]',
     {"kind": "net.http", "method": "POST", "url": "https://api.github.com:443/"}, "api"),
    ("host", 'hosts ["api.github.com"]', 'hosts ["api.github.com", "uploads.github.com"]',
     {"kind": "net.http", "url": "https://uploads.github.com:443/"}, "api"),
    ("regex", "/--(oneline|stat)/", "/--(oneline|stat|output=.*)/",
     {"kind": "proc.exec", "tool": "git", "args": ["log", "--output="]}, "git"),
    ("path", 'paths ["/workspace/**"]', 'paths ["/workspace/**", "/srv/**"]',
     {"kind": "fs.read", "path": "/srv"}, "read-ws"),
])
def test_a_widening_is_found_with_a_witness_and_both_rules(
        tmp_path: Path, name: str, before: str, after: str, op: dict[str, Any],
        new_rule: str) -> None:
    found = changes(tmp_path, BASE, BASE.replace(before, after))
    match = [c for c in found if c["op"] == op]
    assert match, f"{name}: {found}"
    c = match[0]
    assert c["widening"]
    assert c["category"] == "widening"
    assert c["old"] == {"decision": "deny", "code": "SANDBOX.PERMISSION_DENY", "rule": None}
    assert c["new"]["decision"] == "allow"
    assert str(c["new"]["rule"]).startswith(f"{new_rule}@new.sbpolicy:")
    assert c["grant"]["capabilities"]  # the grant the witness needs


def test_a_method_widening_is_a_widening_in_the_markdown_comment(tmp_path: Path) -> None:
    code, md = run(tmp_path, BASE, BASE.replace('methods ["GET"]', 'methods ["GET", "POST"]'),
                   "--format", "markdown")
    assert code == 1
    assert "No decision changes" not in md
    assert "| ⚠️ widening | `net.http POST https://api.github.com:443/` |" in md


def test_a_raised_limit_is_a_widening_field_by_field(tmp_path: Path) -> None:
    found = changes(tmp_path, BASE, BASE.replace("bytes_in 1MiB", "bytes_in 2MiB"))
    limits = [lc for c in found for lc in c["limits"]]
    assert {"field": "max_bytes_in", "old": 1048576, "new": 2097152, "stricter": "old"} in limits
    over = [c for c in found if c["op"] == {"kind": "fs.read", "path": "/workspace",
                                            "len": 1048577}]
    assert over
    assert over[0]["old"]["decision"] == "deny"
    assert over[0]["new"]["decision"] == "allow"


def test_a_forbid_added_then_removed(tmp_path: Path) -> None:
    added = changes(tmp_path, BASE, BASE + FORBID)
    log = [c for c in added if c["op"] == {"kind": "proc.exec", "tool": "git", "args": ["log"]}]
    assert log
    assert log[0]["category"] == "narrowing"
    assert str(log[0]["new"]["rule"]).startswith("no-log@")
    removed = changes(tmp_path, BASE + FORBID, BASE)
    assert any(c["widening"] and c["op"] == log[0]["op"] for c in removed)


def test_a_consent_rule_change_is_decided_per_consent_and_manifest_class(tmp_path: Path) -> None:
    old = ('policy "t" version "1"\npermit "w" fs.write paths ["/workspace/**"]\n'
           'permit "r" fs.read paths ["/workspace/**"]\n')
    new = old + 'require consent when `"Write" in profile.side_effects`\n'
    found = changes(tmp_path, old, new)
    # the built-in consent rule (High safety, Write/Process effects) gives way to the written one
    assert any(c["widening"] and "consent absent" in str(c["setting"]) for c in found)
    code, out = run(tmp_path, old, new)
    assert "consent condition changed" in out


def test_a_changed_condition_is_listed_as_not_decided_never_equal(tmp_path: Path) -> None:
    old = BASE + 'permit "w" fs.write paths ["/tmp/x/**"] when `grant.tenant == "a"`\n'
    code, out = run(tmp_path, old, old.replace('"a"', '"b"'))
    assert code == 1
    assert ("undecided: fs.write condition (w): condition changed, not decided: before "
            '`grant.tenant == "a"`, after `grant.tenant == "b"`') in out


def test_a_size_comparison_is_decided_exactly(tmp_path: Path) -> None:
    old = BASE + 'permit "w" fs.write paths ["/workspace/x/**"] when `request.size <= 10`\n'
    code, out = run(tmp_path, old, old.replace("<= 10", "<= 20"))
    assert code == 1
    assert "undecided:" not in out
    assert "widening: fs.write /workspace/x (size=11)" in out


def test_identical_policies_exit_0(tmp_path: Path) -> None:
    code, out = run(tmp_path, BASE, BASE)
    assert code == 0
    assert "exact diff: 0 change(s), 0 widening, 0 undecided" in out


def test_a_policy_that_does_not_compile_is_located_and_never_diffed(tmp_path: Path) -> None:
    code, out = run(tmp_path, BASE, BASE + "permit oops\n")
    assert code == 2
    assert "new.sbpolicy:6:" in out
    assert "exact diff" not in out


def test_past_the_state_bound_the_dimension_is_too_complex_naming_the_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.sbpolicy").write_text(BASE)
    (tmp_path / "b.sbpolicy").write_text(BASE.replace('"/workspace/**"', '"/workspace/**/x*y"'))
    old, new = compile_files([tmp_path / "a.sbpolicy"]), compile_files([tmp_path / "b.sbpolicy"])
    monkeypatch.setattr(automata, "MAX_STATES", 5)
    monkeypatch.setattr(automata.venn, "__kwdefaults__", {"symbols": None, "max_states": 5,
                                                          "stop": None})
    report = exact_diff(old, new)
    paths = [u for u in report.undecided if u.dimension == "paths" and u.kind == "fs.read"]
    assert paths
    assert "read-ws" in paths[0].rules
    assert "too complex to decide exactly" in paths[0].reason
    assert not report.exact


# ---- analyze ----------------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies" / "org.sbpolicy"


def analyze(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["analyze", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_analyze_read_proves_absence_or_shows_a_witness() -> None:
    code, out = analyze(str(EXAMPLES), "--read", "~/.ssh/**")
    assert code == 0
    assert out.startswith("ok: can anything read a path matching `~/.ssh/**`? no:")
    code, out = analyze(str(EXAMPLES), "--read", "/workspace/src/**", "--format", "json")
    assert code == 1
    answer = json.loads(out)["answers"][0]
    assert answer["finding"]
    assert answer["witness"]["op"]["path"].startswith("/workspace/src")
    assert answer["witness"]["decision"]["rule"].startswith("read-workspace@")


def test_analyze_reach_a_host_and_an_address() -> None:
    code, out = analyze(str(EXAMPLES), "--reach", "10.1.2.3", "--reach", "192.168.1.1")
    assert code == 1
    assert "`net.http http://10.1.2.3:80/` is allowed by lan-mirror@" in out
    assert "reach host `192.168.1.1`? no" in out


def test_analyze_finds_a_shadowed_rule_and_a_shell(tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text(BASE + 'permit "git-any-dash" proc.exec tool "git" args [/--(a|b)/]\n'
                 'permit "git-dash" proc.exec tool "git" args [/--.*/]\n'
                 'permit "sh" proc.exec tool "bash"\n')
    code, out = analyze(str(p), "--rule", "git-any-dash", "--rule", "git-dash", "--shell")
    assert code == 1
    assert "FINDING: is rule `git-any-dash` reachable (not shadowed)? no" in out
    assert "ok: is rule `git-dash` reachable (not shadowed)? yes" in out
    assert "FINDING: does any permit allow a shell or interpreter with any arguments? yes: " \
           "`bash` with any arguments" in out


def test_analyze_grant_within_manifest_and_policy(tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text(BASE)
    cap = [{"kind": "fs.read", "paths": ["/workspace/**", "/etc/**"]}]
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "s", "tool_name": "t", "call_id": "c",
        "expires_at": 4_000_000_000_000, "capabilities": cap}))
    (tmp_path / "m.json").write_text(json.dumps({"name": "t", "version": "1",
                                                 "permissions": cap}))
    code, out = analyze(str(p), "--grant", str(tmp_path / "g.json"), "--manifest",
                        str(tmp_path / "m.json"), "--format", "sarif")
    assert code == 1
    sarif = json.loads(out)
    schema = EXAMPLES.parents[2] / "tests" / "data" / "sarif-schema-2.1.0.json"
    jsonschema.validate(sarif, json.loads(schema.read_text()))  # the offline SARIF 2.1.0 schema
    result = sarif["runs"][0]["results"][0]
    assert sarif["version"] == "2.1.0"
    assert result["ruleId"] == "grant"
    assert result["level"] == "error"
    assert "/etc" in result["message"]["text"]


def test_analyze_bad_input_exits_2(tmp_path: Path) -> None:
    code, out = analyze(str(EXAMPLES), "--rule", "nope")
    assert code == 2
    assert "no rule `nope`" in out
    (tmp_path / "bad.sbpolicy").write_text("policy oops\n")
    code, out = analyze(str(tmp_path / "bad.sbpolicy"), "--shell")
    assert code == 2
    assert "bad.sbpolicy:1:" in out


# ---- lint -------------------------------------------------------------------------------------


def test_lint_finds_a_regex_shadow_the_approximation_missed_and_no_false_one(
        tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text('policy "t/p" version "1"\ndefaults { timeout 60s }\n'
                 'permit "wide" proc.exec tool "git" args [/--.*/]\n'
                 'permit "narrow" proc.exec tool "git" args [/--(a|b)/]\n'
                 'permit "other" proc.exec tool "git" args [/-(a|b)/]\n')
    result = lint_paths([str(p)], LintConfig(), jobs=1)
    found = [(f.id, f.span.line) for f in result.active() if f.span and f.id == "SBP339"]
    assert found == [("SBP339", 4)]  # `narrow` only: `-a` is not under /--.*/


def test_an_env_name_allowed_by_a_new_regex_is_a_widening(tmp_path: Path) -> None:
    old = 'policy "t" version "1"\npermit "git" proc.exec tool "git" args ["status"] ' \
          'env ["LANG", /^LC_/]\n'
    found = changes(tmp_path, old, old.replace('/^LC_/]', '/^LC_/, /TOKEN/]'))
    widened = [c for c in found if c["widening"]]
    assert len(widened) == 1
    env = widened[0]["op"]["env"]
    assert len(env) == 1
    assert "TOKEN" in next(iter(env))


def test_lint_finds_duplicates_written_otherwise(tmp_path: Path) -> None:
    p = tmp_path / "p.sbpolicy"
    p.write_text('policy "t/p" version "1"\ndefaults { timeout 60s }\n'
                 'forbid "a" fs.read paths ["/srv/x/**", "/srv/y/**"]\n'
                 'forbid "b" fs.read paths ["/srv/y/**", "/srv/x/**"]\n'
                 'forbid "c" proc.exec tool "git" args [/--(a|b)/]\n'
                 'forbid "d" proc.exec tool "git" args [/--a|--b/]\n'
                 'forbid "e" proc.exec tool "git" args [/--(a|c)/]\n')
    result = lint_paths([str(p)], LintConfig(), jobs=1)
    found = [(f.id, f.span.line) for f in result.active() if f.span and f.id == "SBP337"]
    assert found == [("SBP337", 4), ("SBP337", 6)]


def test_an_international_host_is_compared_in_its_ascii_form(tmp_path: Path) -> None:
    old = BASE.replace('hosts ["api.github.com"]', 'hosts ["bücher.example"]')
    found = changes(tmp_path, old, old.replace('["bücher.example"]',
                                               '["bücher.example", "*.bücher.example"]'))
    urls = [c["op"]["url"] for c in found if c["widening"]]
    assert urls
    assert all(u.startswith("https://") and u.endswith(".xn--bcher-kva.example:443/")
               for u in urls)
    # the same name written in Unicode and in ASCII is one rule: nothing changes
    code, _ = run(tmp_path, old, old.replace("bücher.example", "xn--bcher-kva.example"))
    assert code == 0
