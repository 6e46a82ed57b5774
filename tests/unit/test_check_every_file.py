"""`check` and `lint` accept every file the engine loads, with positions (issue 16 item 1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from policy_engine.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
LOADED = [
    "manifests/file-editor.sbpolicy",   # a `tool` block only
    "manifests/shell.json",
    "manifests/http-fetch.yaml",
    "grants/shell-agent.json",
    "requests/git-status.json",
    "policies/org.sbtest.yaml",
    "policies/org.sbpolicy",
]


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exc_info
    assert "Traceback" not in res.output
    return res.exit_code, res.output


@pytest.mark.parametrize("rel", LOADED)
def test_check_accepts_each_file_the_engine_loads(rel: str) -> None:
    code, out = run("check", str(EXAMPLES / rel))
    assert code == 0, out
    assert "0 error(s)" in out


@pytest.mark.parametrize("rel", LOADED)
def test_lint_reads_each_file_the_engine_loads(rel: str) -> None:
    code, out = run("lint", "--format", "json", str(EXAMPLES / rel))
    report = json.loads(out)
    assert report["unusable"] == []
    assert not [f for f in report["findings"] if f["id"] < "SBP300"]
    assert code in (0, 1)   # lint findings may fail; the input is usable


def test_settings_and_config_documents(tmp_path: Path) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("root_fs: /workspace\nlimits:\n  timeout_ms: 0\n")
    config = tmp_path / "engine.yaml"
    config.write_text("state_dir: var\nbackends:\n  fs.read: fs\nmodee: strict\n")
    code, out = run("check", "--format", "json", str(settings), str(config))
    assert code == 1
    found = {(d["file"], d["line"], d["column"], d["id"]) for d in json.loads(out)["diagnostics"]}
    assert found == {
        (str(settings), 3, 3, "SBP105"),   # `timeout_ms: 0` is below the minimum
        (str(config), 4, 1, "SBP105"),     # the misspelt key, where it is written
    }
    settings.write_text("root_fs: /workspace\nlimits: {timeout_ms: 1000}\n")
    assert run("check", str(settings))[0] == 0


def test_a_bad_grant_is_reported_at_the_field(tmp_path: Path) -> None:
    grant = json.loads((EXAMPLES / "grants" / "shell-agent.json").read_text())
    grant["expires_at"] = "soon"
    path = tmp_path / "g.json"
    path.write_text(json.dumps(grant, indent=2))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if '"expires_at"' in text)
    for command in ("check", "lint"):
        code, out = run(command, str(path))
        assert f"g.json:{line}:3: SBP105 invalid grant field `expires_at`" in out
        assert code == (1 if command == "check" else 2)


def test_a_request_naming_a_missing_fixture(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{\n  "op": {"kind": "fs.read", "path": "/workspace/a"},\n'
                    '  "manifest": "nope.json"\n}\n')
    code, out = run("check", str(path))
    assert code == 1
    assert "r.json:3:3: SBP105 the request's manifest `nope.json` is not a file" in out


def test_an_unrecognisable_document_says_how_to_name_its_kind(tmp_path: Path) -> None:
    path = tmp_path / "what.yaml"
    path.write_text("foo: 1\n")
    code, out = run("check", str(path))
    assert code == 1
    assert "what.yaml:1:1: SBP105 cannot tell which engine document this is" in out
    assert "--kind" in out
    code, out = run("check", "--kind", "settings", str(path))
    assert "invalid settings field `foo`" in out


def test_lint_holds_json_manifest_capabilities_to_the_permit_rules(tmp_path: Path) -> None:
    path = tmp_path / "bashtool.json"
    path.write_text(json.dumps({
        "name": "bashtool", "version": "1.0", "permissions": [
            {"kind": "proc.exec", "tool": "bash"},
            {"kind": "fs.write", "paths": ["/**"]},
            {"kind": "net.http", "hosts": ["*.github.io"]},
        ]}, indent=1))
    lines = path.read_text().splitlines()

    def line_of(text: str) -> int:
        return next(i for i, line in enumerate(lines, 1) if text in line)

    code, out = run("lint", "--format", "json", str(path))
    assert code == 1
    found = sorted((f["id"], f["line"]) for f in json.loads(out)["findings"])
    assert found == [("SBP300", line_of('"/**"')), ("SBP302", line_of('"*.github.io"')),
                     ("SBP303", line_of('"/**"')), ("SBP310", line_of('"bash"'))]


def test_a_directory_walk_takes_documents_and_leaves_foreign_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "manifests", repo / "manifests")
    # the examples' reasoned suppressions aside: the manifests' real findings make exit 1
    suppressions = (repo / "manifests" / ".sbpolicy-ignore.yaml").read_text()
    (repo / "manifests" / ".sbpolicy-ignore.yaml").unlink()
    (repo / "package.json").write_text('{"name": "x", "scripts": {}, "dependencies": {}}')
    (repo / "ci.yml").write_text("name: ci\non: push\npermissions: {}\njobs: {}\n")
    code, out = run("lint", "--format", "json", str(repo))
    report = json.loads(out)
    assert sorted(Path(f).name for f in report["files"]) == [
        "docs-browser.json", "file-editor.sbpolicy", "http-fetch.yaml", "shell.json"]
    assert report["unusable"] == []
    assert code == 1   # the example manifests' real findings (SBP302 on *.readthedocs.io)
    (repo / "manifests" / ".sbpolicy-ignore.yaml").write_text(suppressions)
    code, out = run("lint", "--format", "json", str(repo))
    assert code == 0, out  # each finding suppressed with its reason; the file is no document
    assert sorted(Path(f).name for f in json.loads(out)["files"]) == [
        "docs-browser.json", "file-editor.sbpolicy", "http-fetch.yaml", "shell.json"]


@pytest.mark.parametrize("suffix", ["r2.dev", "pythonanywhere.com", "s3.amazonaws.com"])
def test_public_suffix_wildcards_from_the_full_list(tmp_path: Path, suffix: str) -> None:
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "p" version "1"\ndefaults { timeout 10s }\n'
                      f'permit net.http hosts ["*.{suffix}"] methods ["GET"]\n')
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"name": "m", "version": "1", "permissions": [
        {"kind": "net.http", "hosts": [f"*.{suffix}"], "methods": ["GET"]}]}))
    for path, line in ((policy, 3), (manifest, 1)):
        code, out = run("lint", "--format", "json", str(path))
        assert code == 1
        assert [(f["id"], f["line"]) for f in json.loads(out)["findings"]] == [("SBP302", line)]


def test_a_manifest_file_with_two_tool_blocks_is_refused_as_the_loader_would(
        tmp_path: Path) -> None:
    path = tmp_path / "two.sbpolicy"
    path.write_text('tool "a" version "1" {\n  permit fs.read paths ["/w/**"]\n}\n'
                    'tool "b" version "1" {\n  permit fs.read paths ["/w/**"]\n}\n')
    code, out = run("check", str(path))
    assert code == 1
    assert "two.sbpolicy:4:1: SBP105 a tool manifest holds exactly one `tool` block, found " \
           "`a`, `b`" in out
