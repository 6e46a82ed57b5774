"""`.pre-commit-hooks.yaml` passes pre-commit's own schema and every hook runs a real command."""

from __future__ import annotations

import re
import shlex
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pre_commit.clientlib import load_manifest

from policy_engine.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / ".pre-commit-hooks.yaml"
EXAMPLES = ROOT / "examples" / "policies"


def _hooks() -> dict[str, dict[str, Any]]:
    # load_manifest validates against pre-commit's schema and raises InvalidManifestError
    return {hook["id"]: hook for hook in load_manifest(str(MANIFEST))}


def _argv(hook: dict[str, Any]) -> list[str]:
    """The hook's command line after the console-script name, with its default args."""
    script, *rest = shlex.split(hook["entry"])
    assert script == "policy-engine"
    return rest + list(hook["args"])


def test_the_manifest_offers_the_three_hooks() -> None:
    hooks = _hooks()
    assert set(hooks) == {"sbpolicy-lint", "sbpolicy-fmt", "sbpolicy-test"}
    for hook in hooks.values():
        assert hook["language"] == "python"  # pre-commit pip-installs this repository
        assert hook["entry"].split()[0] == "policy-engine"
    assert hooks["sbpolicy-test"]["pass_filenames"] is False
    assert hooks["sbpolicy-lint"]["pass_filenames"] is True
    assert hooks["sbpolicy-fmt"]["pass_filenames"] is True


def test_the_entry_script_is_the_projects_console_script() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["policy-engine"] == "policy_engine.cli.main:main"


@pytest.mark.parametrize(("hook_id", "path", "matches"), [
    ("sbpolicy-lint", "policies/org.sbpolicy", True),
    ("sbpolicy-lint", "org.sbpolicy.bak", False),
    ("sbpolicy-lint", "org.sbtest.yaml", False),
    ("sbpolicy-fmt", "deep/dir/x.sbpolicy", True),
    ("sbpolicy-fmt", "README.md", False),
    ("sbpolicy-test", "policies/org.sbpolicy", True),
    ("sbpolicy-test", "policies/org.sbtest.yaml", True),
    ("sbpolicy-test", "policies/org.sbtest.yml", True),
    ("sbpolicy-test", "policies/config.yaml", False),
])
def test_file_patterns(hook_id: str, path: str, matches: bool) -> None:
    hook = _hooks()[hook_id]
    selected = re.search(hook["files"], path) is not None and not re.search(hook["exclude"], path)
    assert selected is matches


@pytest.mark.parametrize("hook_id", ["sbpolicy-lint", "sbpolicy-fmt", "sbpolicy-test"])
def test_every_entry_is_a_registered_command_that_accepts_its_arguments(hook_id: str) -> None:
    hook = _hooks()[hook_id]
    name, *args = _argv(hook)
    assert name in cli.commands, f"`policy-engine {name}` is not a registered command"
    if hook["pass_filenames"]:
        args += ["a.sbpolicy", "b/c.sbpolicy"]  # pre-commit appends the staged files
    ctx = cli.commands[name].make_context(name, args, resilient_parsing=False)
    assert ctx.command.name == name


def _run(hook_id: str, files: list[str], cwd: Path) -> tuple[int, str]:
    hook = _hooks()[hook_id]
    argv = _argv(hook) + (files if hook["pass_filenames"] else [])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        result = CliRunner().invoke(cli, argv)
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_lint_hook_passes_clean_policies_and_fails_broken_ones(tmp_path: Path) -> None:
    for src in EXAMPLES.glob("*.sbpolicy"):
        shutil.copy(src, tmp_path / src.name)
    code, output = _run("sbpolicy-lint", ["org.sbpolicy", "network.sbpolicy"], tmp_path)
    assert code == 0, output
    (tmp_path / "broken.sbpolicy").write_text('policy "x" version "1"\npermit fs.read paths [\n')
    code, output = _run("sbpolicy-lint", ["broken.sbpolicy"], tmp_path)
    assert code != 0
    assert "broken.sbpolicy:" in output
    assert "SBP1" in output


def test_fmt_hook_rewrites_files_so_pre_commit_sees_the_change(tmp_path: Path) -> None:
    messy = 'policy   "x"   version "1"\n\n\n\npermit   tmp.use    max_bytes   1MiB\n'
    target = tmp_path / "messy.sbpolicy"
    target.write_text(messy)
    _run("sbpolicy-fmt", ["messy.sbpolicy"], tmp_path)
    formatted = target.read_text()
    assert formatted != messy
    assert "\n\n\n" not in formatted  # the blank-line run is collapsed
    assert "permit tmp.use max_bytes 1MiB" in " ".join(formatted.split())  # nothing lost
    # formatting is idempotent: a second run leaves the file alone, so the hook then passes
    _run("sbpolicy-fmt", ["messy.sbpolicy"], tmp_path)
    assert target.read_text() == formatted


def test_test_hook_runs_the_repositorys_policy_tests(tmp_path: Path) -> None:
    (tmp_path / "p.sbpolicy").write_text(
        'policy "t" version "1"\npermit "tmp" tmp.use max_bytes 1MiB\n')
    manifest = ROOT / "examples" / "manifests" / "shell.json"
    grant = ROOT / "examples" / "grants" / "shell-agent.json"
    case = ("  - name: {name}\n    op: {{kind: tmp.alloc, size_bytes: 1024}}\n"
            "    want_decision: {want}\n")
    head = (f"policy: p.sbpolicy\nmanifest: {manifest}\ngrant: {grant}\n"
            "now_ms: 1795000000000\ncases:\n")
    (tmp_path / "p.sbtest.yaml").write_text(head + case.format(name="small", want="allow"))
    code, output = _run("sbpolicy-test", [], tmp_path)
    assert code == 0, output
    (tmp_path / "p.sbtest.yaml").write_text(head + case.format(name="wrong", want="deny"))
    code, output = _run("sbpolicy-test", [], tmp_path)
    assert code == 1, output
    assert "wrong" in output
