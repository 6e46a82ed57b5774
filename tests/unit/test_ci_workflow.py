"""The GitHub Actions example: each `policy-engine` line parses with the real CLI and works."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from policy_engine.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "ci" / "github-workflow.yml"
SARIF_SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"


def _workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _steps() -> list[dict[str, Any]]:
    jobs = _workflow()["jobs"]
    assert len(jobs) == 1
    steps = next(iter(jobs.values()))["steps"]
    assert isinstance(steps, list)
    return steps


def _commands() -> list[list[str]]:
    """Every `policy-engine ...` command line of the workflow's `run` steps, split like a shell."""
    out = []
    for step in _steps():
        for line in str(step.get("run", "")).splitlines():
            if line.strip().startswith("policy-engine "):
                # `|| test $? -eq 1`: the shell's handling of the exit code, not arguments
                out.append(shlex.split(line.split(" || ")[0])[1:])
    return out


def _step_running(command: str) -> dict[str, Any]:
    return next(s for s in _steps() if str(s.get("run", "")).startswith(f"policy-engine {command}"))


def test_the_workflow_runs_lint_fmt_and_test() -> None:
    names = [argv[0] for argv in _commands()]
    assert names == ["lint", "fmt", "test", "diff"]
    lint, fmt, test, _diff = _commands()
    assert lint == ["lint", "--format", "sarif", "--output", "lint.sarif", "policies/",
                    "manifests/"]
    assert fmt == ["fmt", "--check", "policies/", "manifests/"]
    assert test == ["test", "--coverage", "--threshold", "90", "--junit", "junit.xml", "policies/"]


def test_sarif_is_uploaded_even_when_lint_fails() -> None:
    workflow = _workflow()
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers
    assert workflow["permissions"]["security-events"] == "write"
    upload = next(s for s in _steps() if "upload-sarif" in str(s.get("uses", "")))
    assert upload["uses"] == "github/codeql-action/upload-sarif@v3"
    assert "always()" in upload["if"]
    lint = _commands()[0]
    assert upload["with"]["sarif_file"] == lint[lint.index("--output") + 1]
    steps = _steps()
    assert steps.index(upload) == steps.index(_step_running("lint")) + 1
    # the later checks still run after a lint failure, so one push reports everything
    assert "cancelled()" in _step_running("fmt")["if"]
    assert "cancelled()" in _step_running("test")["if"]


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: a[0])
def test_every_command_line_parses_with_the_real_cli(argv: list[str]) -> None:
    name, *args = argv
    assert name in cli.commands, f"`policy-engine {name}` is not a registered command"
    ctx = cli.commands[name].make_context(name, list(args), resilient_parsing=False)
    assert ctx.command.name == name


def _repo(tmp_path: Path) -> Path:
    """A policy repository like the one the workflow expects: policies/ with passing tests,
    and manifests/."""
    shutil.copytree(ROOT / "examples" / "manifests", tmp_path / "manifests")
    policies = tmp_path / "policies"
    policies.mkdir()
    for src in (ROOT / "examples" / "policies").glob("*.sbpolicy"):
        shutil.copy(src, policies / src.name)
    examples = ROOT / "examples"
    (policies / "org.sbtest.yaml").write_text(
        "policy: org.sbpolicy\n"
        f"manifest: {examples / 'manifests' / 'shell.json'}\n"
        f"grant: {examples / 'grants' / 'shell-agent.json'}\n"
        "now_ms: 1795000000000\ncases:\n"
        "  - name: git status is allowed\n"
        "    op: {kind: proc.exec, tool: git, args: [status]}\n"
        "    want_decision: allow\n    want_rule: git-readonly\n"
        "  - name: force push is refused\n"
        "    op: {kind: proc.exec, tool: git, args: [push, --force]}\n"
        "    want_decision: deny\n")
    return tmp_path


def _invoke(argv: list[str], cwd: Path) -> tuple[int, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        result = CliRunner().invoke(cli, argv)
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_the_lint_step_writes_valid_sarif(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    code, output = _invoke(_commands()[0], repo)
    assert code in (0, 1), output  # 1: findings, which the upload step still reports
    sarif = json.loads((repo / "lint.sarif").read_text())
    jsonschema.validate(sarif, json.loads(SARIF_SCHEMA.read_text()))
    assert sarif["version"] == "2.1.0"
    # the manifests are linted too: JSON/YAML ones and the `tool`-block one
    located = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
               for r in sarif["runs"][0]["results"]}
    assert "manifests/http-fetch.yaml" in located
    # no link to a repository that is not the one the engine came from (here: a checkout)
    assert "acme/policy-engine" not in json.dumps(sarif)


def test_sarif_help_links_point_at_the_installed_versions_docs(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    docs_url = "https://git.example.com/sec/policy-engine/blob/v0.1.0/docs/"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POLICY_ENGINE_DOCS_URL", docs_url)
        code, output = _invoke(_commands()[0], repo)
    assert code in (0, 1), output
    rules = json.loads((repo / "lint.sarif").read_text())["runs"][0]["tool"]["driver"]["rules"]
    links = {r["id"]: r["helpUri"] for r in rules}
    assert links["SBP302"] == docs_url + "lint-rules.md#sbp302"
    # each anchor is a heading of the docs this project ships
    shipped = (ROOT / "docs" / "lint-rules.md").read_text()
    assert all(f"\n## {rule_id}\n" in shipped for rule_id in links if rule_id >= "SBP300")
    # an unusable input's diagnostic links to the error-code reference
    (repo / "manifests" / "broken.json").write_text('{"name": "x", "version": 1,')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POLICY_ENGINE_DOCS_URL", docs_url)
        code, output = _invoke(_commands()[0], repo)
    assert code == 2, output
    rules = json.loads((repo / "lint.sarif").read_text())["runs"][0]["tool"]["driver"]["rules"]
    assert {r["id"]: r["helpUri"] for r in rules}["SBP105"] == \
        docs_url + "error-codes.md#policy-file-diagnostics"
    assert "\n## Policy-file diagnostics\n" in (ROOT / "docs" / "error-codes.md").read_text()


def test_a_git_install_links_to_its_own_commit() -> None:
    from policy_engine.lint.output.docs_url import from_direct_url

    # what pip writes to direct_url.json (PEP 610) for `pip install "policy-engine @ git+..."`
    recorded = {"url": "https://github.com/sec-team/policy-engine.git",
                "vcs_info": {"vcs": "git", "requested_revision": "v0.1.0",
                             "commit_id": "0123456789abcdef0123456789abcdef01234567"}}
    assert from_direct_url(json.dumps(recorded)) == (
        "https://github.com/sec-team/policy-engine/blob/"
        "0123456789abcdef0123456789abcdef01234567/docs/")
    gitlab = {**recorded, "url": "https://gitlab.example.com/sec/policy-engine.git"}
    assert from_direct_url(json.dumps(gitlab)).startswith(  # type: ignore[union-attr]
        "https://gitlab.example.com/sec/policy-engine/-/blob/0123")
    # a wheel or a local directory records no repository: no link rather than a guess
    assert from_direct_url(json.dumps({"url": "https://x/policy_engine-0.1.0.whl",
                                       "archive_info": {}})) is None
    assert from_direct_url(json.dumps({"url": "file:///src/pe", "dir_info": {}})) is None


def test_the_install_step_is_a_wheel_or_git_url_and_nothing_needs_a_requirements_file() -> None:
    setup = next(s for s in _steps() if "setup-python" in str(s.get("uses", "")))
    assert "cache" not in setup["with"]   # `cache: pip` fails without a requirements file
    assert _workflow()["env"]["POLICY_ENGINE"] == "${{ vars.POLICY_ENGINE }}"
    install = next(s for s in _steps() if "pip install" in str(s.get("run", "")))
    assert 'python -m pip install "$POLICY_ENGINE"' in install["run"]
    assert "::error::" in install["run"]   # an unset variable says what to do
    text = WORKFLOW.read_text()
    assert "policy-engine==" not in text
    assert "git+https://" in text
    assert ".whl" in text


def test_the_fmt_step_passes_on_formatted_policies(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    fmt, check, *targets = _commands()[1]
    assert (fmt, check) == ("fmt", "--check")
    _invoke(["fmt", *targets], repo)  # format in place first, as a developer would
    code, output = _invoke(_commands()[1], repo)
    assert code == 0, output
    (repo / "policies" / "secrets.sbpolicy").write_text(
        'policy  "acme/secrets"   version "1.0.0"\n\n\n\nforbid   fs.read paths ["/k"]\n')
    code, output = _invoke(_commands()[1], repo)
    assert code == 1, output
    assert "secrets.sbpolicy" in output


def test_the_test_step_writes_junit(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    argv = _commands()[2]
    code, output = _invoke(argv, repo)
    assert code in (0, 1), output  # 1 only when coverage is under the threshold
    suite = ElementTree.parse(repo / argv[argv.index("--junit") + 1]).getroot()
    cases = suite.findall(".//testcase")
    assert {c.get("name") for c in cases} >= {"git status is allowed", "force push is refused"}
    assert not suite.findall(".//failure")


def test_the_diff_step_writes_a_markdown_comment_of_the_changed_decisions(
        tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    argv = _commands()[3]
    assert argv[0] == "diff"
    # the base branch's policies, as `git archive` unpacks them, and a change in the PR
    shutil.copytree(repo / "policies", repo / "base" / "policies")
    org = repo / "policies" / "org.sbpolicy"
    # removing a redundant forbid (no permit lets `git push` through) only renames the refusal
    org.write_text(org.read_text().replace('forbid "no-force-push"', '# forbid "no-force-push"'))
    code, output = _invoke(argv, repo)
    assert code == 0, output  # no widening: the gate stays quiet
    comment = (repo / argv[argv.index("--output") + 1]).read_text()
    assert comment.startswith("### Policy diff: `org.sbpolicy` → `org.sbpolicy`")
    assert "force push is refused" in comment
    assert "no-force-push@org.sbpolicy" in comment
    # removing the release forbid lets writes into release/ through: a widening, exit 1
    org.write_text(org.read_text().replace('forbid "no-release-edits"',
                                           '# forbid "no-release-edits"'))
    code, output = _invoke(argv, repo)
    assert code == 1, output
    comment = (repo / argv[argv.index("--output") + 1]).read_text()
    assert "⚠️ widening | `fs.write /workspace/work/release" in comment
    gate = _steps()[_steps().index(next(s for s in _steps() if s.get("id") == "diff")) + 2]
    assert "steps.diff.outputs.widening == 'true'" in gate["if"]
    assert "policy-widening" in gate["if"]
    step = next(s for s in _steps() if "policy-engine diff" in str(s.get("run", "")))
    assert "pull_request" in step["if"]
    post = _steps()[_steps().index(step) + 1]
    assert post["with"]["path"] == argv[argv.index("--output") + 1]
