"""Cold start: `import policy_engine` and `policy-engine explain|check` load no command or
authoring tool they do not use, `--help` still lists every command, and the grammar's analysis is
cached only where nobody else can write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.cli.main import COMMAND_MODULES, cli

ROOT = Path(__file__).resolve().parents[2]
AUTHORING = ("policy_engine.lint", "policy_engine.fmt", "policy_engine.policytest",
             "policy_engine.conformance", "policy_engine.service", "policy_engine.replay",
             "policy_engine.lsp", "pygls", "lsprotocol")


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, **(env or {})})
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _loaded(mods: set[str], prefix: str) -> bool:
    return any(m == prefix or m.startswith(prefix + ".") for m in mods)


def test_import_policy_engine_loads_nothing_heavy() -> None:
    mods = _modules_after("import policy_engine")
    for heavy in (*AUTHORING, "policy_engine.compiler", "policy_engine.orchestrator", "lark",
                  "pydantic"):
        assert not _loaded(mods, heavy), heavy
    # the public names still work, on first use
    mods = _modules_after("import policy_engine as p\nassert p.Guard.__name__ == 'Guard'")
    assert _loaded(mods, "policy_engine.guard")


def _cli_modules(*argv: str) -> set[str]:
    code = (f"import sys\nsys.argv = ['policy-engine', *{list(argv)!r}]\n"
            "from policy_engine.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    # the normal exit: the probe prints after main() returns
    return _modules_after(code, {"POLICY_ENGINE_FAST_EXIT": "0"})


def test_explain_and_check_load_only_their_own_command() -> None:
    explain = _cli_modules("explain", "--policy", "examples/policies/org.sbpolicy",
                           "--request", "examples/requests/git-status.json")
    check = _cli_modules("check", "examples/policies/org.sbpolicy")
    for mods, own in ((explain, "explain"), (check, "check")):
        assert f"policy_engine.cli.{own}" in mods
        others = [m for m in COMMAND_MODULES
                  if m != own and f"policy_engine.cli.{m.replace('-', '_')}" in mods]
        assert others == [], others
        for heavy in AUTHORING:
            assert not _loaded(mods, heavy), (own, heavy)
    # a dry run of a JSON request loads no config reader's YAML, mask planner, evidence spool or
    # revocation list (none of them decides anything explain shows)
    for heavy in ("yaml", "policy_engine.sandbox.masks", "policy_engine.evidence.spool",
                  "policy_engine.orchestration.revocation", "sqlite3", "logging"):
        assert not _loaded(explain, heavy), heavy
    # a policy check reads no YAML and names no international host
    assert not _loaded(check, "yaml")
    assert not _loaded(check, "idna")
    # the fast reader reads the example policies: the Lark parser is never loaded
    for mods in (explain, check):
        assert not _loaded(mods, "lark")
        assert "policy_engine.dsl.parser" not in mods


def test_help_lists_every_command_with_its_help() -> None:
    from click.testing import CliRunner

    out = CliRunner().invoke(cli, ["--help"]).output
    for name in COMMAND_MODULES:
        short = cli.commands[name].get_short_help_str(limit=200)
        assert f"  {name} " in out, name
        assert short[:15] in out, name
    assert sorted(cli.commands) == sorted(COMMAND_MODULES)
    assert "nope" not in cli.commands


def test_grammar_cache_is_private_and_reused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    code = ("from policy_engine.dsl.grammar import get_parser\n"
            "p = get_parser()\nassert p.parse('policy \"a\" version \"1\"\\n') is not None")
    env = {"POLICY_ENGINE_STATE": str(state)}
    _modules_after(code, env)
    files = list((state / "cache").glob("sbpolicy-grammar-*.lark"))
    assert len(files) == 1
    assert (state / "cache").stat().st_mode & 0o777 == 0o700
    assert not [p for p in (state / "cache").iterdir() if p.name.startswith(".")]
    # a cache file another user could have written is never loaded (it would be a pickle)
    files[0].chmod(0o666)
    before = files[0].read_bytes()
    _modules_after(code, env)
    assert files[0].read_bytes() == before  # not rewritten, not trusted: built from the grammar
    # a world-writable cache directory is not used at all
    files[0].unlink()
    (state / "cache").chmod(0o777)
    _modules_after(code, env)
    assert list((state / "cache").glob("sbpolicy-grammar-*.lark")) == []


@pytest.mark.parametrize("value", ["0", "off"])
def test_grammar_cache_can_be_turned_off(tmp_path: Path, value: str) -> None:
    env = {"POLICY_ENGINE_STATE": str(tmp_path), "POLICY_ENGINE_GRAMMAR_CACHE": value}
    _modules_after("from policy_engine.dsl.grammar import get_parser\nget_parser()", env)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())
