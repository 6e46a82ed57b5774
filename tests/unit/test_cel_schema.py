"""CEL conditions are checked against the closed schemas of what the guard passes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.compiler import check_files
from policy_engine.dsl.cel_schema import field_refs, unknown_fields


def check(tmp_path: Path, cond: str) -> list[tuple[str, int, int, str]]:
    path = tmp_path / "p.sbpolicy"
    path.write_text(f'policy "t" version "1"\npermit fs.read paths ["/w/**"] when `{cond}`\n')
    return [(d.id, d.span.line, d.span.column, d.message) for d in check_files([path])
            if d.span is not None]


@pytest.mark.parametrize(("cond", "field", "hint"), [
    ('grant.subjectid.startsWith("agent:")', "`grant` has no field `subjectid`", "subject_id"),
    ("grant.budget.cals > 1", "`grant.budget` has no field `cals`", "calls"),
    ('manifest.safety == "High"', "`manifest` has no field `safety`", "safety_class"),
    ('profile["safty"] == "High"', "`profile` has no field `safty`", "safety"),
    ('request.pth == "/w/a"', "`request` has no field `pth`", "path"),
    ('subject.idd == "agent:a"', "`subject` has no field `idd`", "id"),
    ('has(grant.consent.granted_byy)', "`grant.consent` has no field `granted_byy`",
     "granted_by"),
])
def test_unknown_fields_are_check_errors_with_a_suggestion(
        tmp_path: Path, cond: str, field: str, hint: str) -> None:
    [(diag_id, line, column, message)] = check(tmp_path, cond)
    assert diag_id == "SBP210"
    assert field in message
    assert message.endswith(f"did you mean `{hint}`?")
    # the caret points at the field inside the backticks (the CEL text starts at column 38)
    name = field.split("`")[3]
    offset = cond.index("." + name) + 1 if "." + name in cond else cond.index('["' + name)
    assert (line, column) == (2, 38 + offset)


@pytest.mark.parametrize("cond", [
    'grant.subject_id.startsWith("agent:") && request.size <= 1048576',
    'tenant.tier == "gold" && subject.id != "" && tenant.trust < 3',
    'grant.capabilities.exists(c, c.kind == "fs.read" && c.paths.size() > 0)',
    'request.headers["X-Anything"] == "1" || request.env.LANG == "C"',
    '"grant.nope".startsWith("grant.") || profile.safety == "High"',
    'manifest.version != "" && grant.budget.calls > 0 && has(grant.consent.granted_by)',
])
def test_known_fields_and_open_maps_pass(tmp_path: Path, cond: str) -> None:
    assert check(tmp_path, cond) == []


@pytest.mark.parametrize(("cond", "field"), [
    ('manifest.description.startsWith("Runs")', "`manifest` has no field `description`"),
    ("manifest.limits.max_stdout_bytes > 0", "`manifest` has no field `limits`"),
    ('grant.decision_key_fingerprint == "fp"', "`grant` has no field `decision_key_fingerprint`"),
    ("has(grant.limits)", "`grant` has no field `limits`"),
])
def test_model_fields_the_views_do_not_carry_are_check_errors(
        tmp_path: Path, cond: str, field: str) -> None:
    """The guard's ``grant`` and ``manifest`` views hold what a profile carries; a condition on
    anything else would never hold at run time (attack round 8 F10), so ``check`` refuses it."""
    [(diag_id, _, _, message)] = check(tmp_path, cond)
    assert diag_id == "SBP210"
    assert field in message


def test_the_checked_views_are_the_views_the_guard_builds() -> None:
    from policy_engine.compiler import compile_files
    from policy_engine.compiler.loaders import load_grant, load_manifest
    from policy_engine.dsl.cel_schema import schemas
    from policy_engine.guard.compiled import static_views
    from policy_engine.profile import ProfileBuilder

    examples = Path(__file__).resolve().parents[2] / "examples"
    ps = compile_files([examples / "policies" / "org.sbpolicy"])
    profile = ProfileBuilder(ps).build(load_grant(examples / "grants" / "shell-agent.json"),
                                       load_manifest(examples / "manifests" / "shell.json"))
    views = static_views(profile)
    for name in ("grant", "manifest", "profile"):
        view = views[name]
        assert isinstance(view, dict)
        assert set(schemas()[name].fields) == set(view), name


def test_method_calls_end_a_chain() -> None:
    refs = field_refs('grant.subject_id.startsWith("a") && request.args.exists(a, a == "x")',
                      {"grant", "request"})
    assert [(r.variable, r.path) for r in refs] == [("grant", ("subject_id",)),
                                                    ("request", ("args",))]
    assert unknown_fields("x.grant.nope == 1") == []  # a field named grant, not the variable


def test_check_and_lint_report_the_typo(tmp_path: Path) -> None:
    path = tmp_path / "p.sbpolicy"
    path.write_text('policy "t" version "1"\n'
                    'permit fs.read paths ["/w/**"] when `grant.subjectid == "a"`\n')
    # check: an error (exit 1); lint: the policy does not compile, an unusable input (exit 2)
    for command, code in (("check", 1), ("lint", 2)):
        result = CliRunner().invoke(cli, [command, str(path)])
        assert result.exit_code == code, result.output
        assert "p.sbpolicy:2:44: SBP210 unknown field in CEL condition: `grant` has no field " \
               "`subjectid`; did you mean `subject_id`?" in result.output
