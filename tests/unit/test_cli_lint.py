"""`policy-engine lint` end to end: exit codes, formats, --output, --deny-warnings, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.lint import lint_paths

ROOT = Path(__file__).resolve().parents[2]
HEAD = 'policy "t/p" version "1"\ndefaults { timeout 60s }\n'


def lint(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["lint", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exc_info
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def policy(tmp_path: Path, body: str, name: str = "p.sbpolicy") -> str:
    p = tmp_path / name
    p.write_text(HEAD + body)
    return str(p)


def test_clean_policy_exits_0(tmp_path: Path) -> None:
    code, out = lint(policy(tmp_path, 'permit fs.read paths ["/workspace/**"]\n'))
    assert code == 0
    assert "1 file(s) linted: 0 error(s), 0 warning(s), 0 note(s)" in out


def test_error_finding_exits_1(tmp_path: Path) -> None:
    code, out = lint(policy(tmp_path, 'permit proc.exec tool "sh" args ["-c", /.*/]\n'))
    assert code == 1
    assert "p.sbpolicy:3:23: SBP310" in out


def test_warnings_fail_only_with_deny_warnings(tmp_path: Path) -> None:
    p = policy(tmp_path, 'permit net.http hosts ["*"]\n')
    assert lint(p)[0] == 0
    assert lint(p, "--deny-warnings")[0] == 1


def test_notes_never_fail(tmp_path: Path) -> None:
    p = policy(tmp_path, 'profile "ci" { network off }\n')
    code, out = lint(p, "--deny-warnings")
    assert code == 0
    assert "SBP341" in out


def test_suppressed_error_does_not_fail(tmp_path: Path) -> None:
    p = policy(tmp_path, '# sbpolicy: ignore SBP310 reason="sandboxed build box"\n'
                         'permit proc.exec tool "sh" args ["build.sh"]\n')
    code, out = lint(p)
    assert code == 0
    assert "1 suppressed" in out


def test_examples_are_clean_and_deny_warnings_fails_on_warnings() -> None:
    paths = [str(ROOT / "examples" / "policies"),
             str(ROOT / "examples" / "manifests" / "file-editor.sbpolicy")]
    # the examples are clean (their three deliberate findings carry reasoned suppressions)
    assert lint(*paths)[0] == 0
    assert lint(*paths, "--deny-warnings")[0] == 0
    warnings_only = str(ROOT / "tests" / "data" / "lint" / "SBP320" / "bad.sbpolicy")
    assert lint(warnings_only)[0] == 0
    assert lint(warnings_only, "--deny-warnings")[0] == 1


def test_syntax_error_is_unusable_input_in_every_format(tmp_path: Path) -> None:
    p = policy(tmp_path, 'permit fs.read paths ["/w/**"\n')
    code, out = lint(p)
    assert code == 2
    assert "SBP103" in out
    assert "unusable" in out
    code, out = lint(p, "--format", "json")
    assert code == 2
    assert json.loads(out)["unusable"] == [p]
    code, out = lint(p, "--format", "github")
    assert code == 2
    assert out.startswith("::error file=")
    assert "title=SBP103" in out


def test_binary_file(tmp_path: Path) -> None:
    p = tmp_path / "bin.sbpolicy"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    code, out = lint(str(p))
    assert code == 2
    assert "SBP10" in out


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    code, out = lint(str(tmp_path / "nope.sbpolicy"))
    assert code == 2
    assert "SBP100" in out
    assert "does not exist" in out
    (tmp_path / "empty").mkdir()
    code, out = lint(str(tmp_path / "empty"))
    assert code == 2
    assert "no `.sbpolicy`, JSON or YAML files under" in out


def test_compile_error_is_unusable(tmp_path: Path) -> None:
    code, out = lint(policy(tmp_path, 'permit fs.read paths ["relative/path"]\n'))
    assert code == 2
    assert "SBP206" in out


def test_directory_is_searched_and_imports_are_linted_in_context(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "net.sbpolicy").write_text(
        'policy "t/lib" version "1"\npermit proc.exec tool "git" args ["status"]\n')
    policy(tmp_path, 'import "lib/net.sbpolicy"\n', "root.sbpolicy")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.sbpolicy").write_text("garbage")
    code, out = lint(str(tmp_path), "--format", "json")
    doc = json.loads(out)
    # the lib has no timeout of its own, but the importing policy's defaults give one
    assert code == 0
    assert doc["findings"] == []
    assert len(doc["files"]) == 2
    code, out = lint(str(tmp_path / "lib"), "--format", "json")
    assert [f["id"] for f in json.loads(out)["findings"]] == ["SBP330"]


def test_output_file_and_sarif(tmp_path: Path) -> None:
    p = policy(tmp_path, 'permit net.http hosts ["*.com"]\n')
    out_file = tmp_path / "report.sarif"
    code, out = lint(p, "--format", "sarif", "--output", str(out_file))
    assert code == 1
    assert out == ""
    doc = json.loads(out_file.read_text())
    assert [r["ruleId"] for r in doc["runs"][0]["results"]] == ["SBP302"]


def test_unwritable_output(tmp_path: Path) -> None:
    p = policy(tmp_path, 'permit fs.read paths ["/w/**"]\n')
    code, out = lint(p, "--output", str(tmp_path / "no" / "such" / "dir" / "r.txt"))
    assert code == 2
    assert "cannot write" in out


def test_select_ignore_validation(tmp_path: Path) -> None:
    p = policy(tmp_path, 'permit net.http hosts ["*"] schemes ["http"]\n')
    code, out = lint(p, "--select", "SBP320", "--format", "json")
    assert [f["id"] for f in json.loads(out)["findings"]] == ["SBP320"]
    code, out = lint(p, "--ignore", "sbp320,SBP301", "--format", "json")
    assert json.loads(out)["findings"] == []
    code, out = lint(p, "--select", "SBP999")
    assert code == 2
    assert "unknown lint rule SBP999" in out


def test_pool_gives_the_same_result_as_one_process(tmp_path: Path) -> None:
    for i in range(60):
        policy(tmp_path, f'permit net.http hosts ["h{i}.example.com"] schemes ["http"]\n'
                         f'permit fs.read paths ["/**"]\n', f"p{i:02d}.sbpolicy")
    one = lint_paths([str(tmp_path)], jobs=1)
    two = lint_paths([str(tmp_path)], jobs=2)
    assert [f.diagnostic for f in one.findings] == [f.diagnostic for f in two.findings]
    assert len(one.findings) == 180  # SBP320, SBP300 and SBP303 in each file


def test_console_script_subprocess(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sbpolicy"
    bad.write_text("policy {{{")
    exe = shutil.which("policy-engine")
    assert exe is not None, "the console script is installed by `pip install -e .`"
    proc = subprocess.run([exe, "lint", str(bad), "--format", "github"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stdout.startswith("::error file=")
    ok = subprocess.run([exe, "lint", str(ROOT / "examples" / "policies")],
                        capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0
    assert "0 warning(s)" in ok.stdout
    assert "3 suppressed" in ok.stdout
