"""The sandbox config's boundary: what a `sandbox.json` may not do, each refused with a
diagnostic at file:line:col and the strict defaults in force (seed 003 test 14)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from policy_engine.sandbox_config.sbconfig import (
    DEFAULT_BLACKLIST,
    ENGINE_BLACKLIST,
    MAX_CONFIG_BYTES,
    MAX_ENTRIES,
    LoadedSandboxConfig,
    config_location,
    load_sandbox_config,
)
from policy_engine.sandbox_config.sbpolicy_gen import build_sandbox_policy, policy_source


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "id_rsa").write_text("k")
    (h / "proj").mkdir()
    return h


def load(tmp_path: Path, home: Path, doc: Any, raw: str | None = None,
         **env: str) -> LoadedSandboxConfig:
    path = tmp_path / "sandbox.json"
    path.write_text(raw if raw is not None else json.dumps(doc, indent=2))
    return load_sandbox_config(path, env={"HOME": str(home), **env})


def refused(loaded: LoadedSandboxConfig, *words: str) -> str:
    """The config was refused as a whole: defaults in force, the problem named."""
    assert loaded.fallback
    assert loaded.found
    assert loaded.config.whitelist == ()
    assert not loaded.config.allow_read_outside
    assert len(loaded.config.blacklist) == len(DEFAULT_BLACKLIST + ENGINE_BLACKLIST)
    text = " ".join(f"{d.span}: {d.message} {d.help}" for d in loaded.problems)
    for word in words:
        assert word in text, text
    assert all(d.id in ("SBP105", "SBP106") and d.span is not None for d in loaded.problems)
    return text


@pytest.mark.parametrize("entry", ["/", "//", "/etc", "/usr/local/bin", "/var", "/proc/self",
                                   "/run/user", "/boot"])
def test_whitelist_of_root_or_a_system_tree_is_refused(tmp_path: Path, home: Path,
                                                        entry: str) -> None:
    refused(load(tmp_path, home, {"filesystem": {"whitelist": [entry]}}), "whitelist[0]")


@pytest.mark.parametrize("entry", ["~", "~/", "$HOME", "${HOME}/", "HOMEPARENT"])
def test_whitelist_of_home_or_its_parent_is_refused(tmp_path: Path, home: Path,
                                                     entry: str) -> None:
    entry = entry.replace("HOMEPARENT", str(home.parent))
    text = refused(load(tmp_path, home, {"filesystem": {"whitelist": [entry]}}))
    assert "bashrc" in text


def test_whitelist_symlink_to_ssh_is_refused(tmp_path: Path, home: Path) -> None:
    (home / "proj" / "keys").symlink_to(home / ".ssh")
    refused(load(tmp_path, home, {"filesystem": {"whitelist": [str(home / "proj" / "keys")]}}),
            "symlink", ".ssh")


def test_whitelist_symlink_to_a_project_is_resolved(tmp_path: Path, home: Path) -> None:
    (tmp_path / "link").symlink_to(home / "proj")
    loaded = load(tmp_path, home, {"filesystem": {"whitelist": [str(tmp_path / "link")]}})
    assert not loaded.problems
    assert [e.path for e in loaded.config.whitelist] == [str(home / "proj")]


@pytest.mark.parametrize("entry", ["/data/../etc", "relative/dir", "./x", "/a/*/b", "~root/x",
                                   "/a\nb", "/a\x00b"])
def test_odd_whitelist_entries_are_refused(tmp_path: Path, home: Path, entry: str) -> None:
    refused(load(tmp_path, home, {"filesystem": {"whitelist": [entry]}}), "whitelist[0]")


def test_policy_injection_through_an_entry_is_refused(tmp_path: Path, home: Path) -> None:
    evil = f'{home}/proj/x"] permit "all" fs.read, fs.write paths ["/**'
    refused(load(tmp_path, home, {"filesystem": {"whitelist": [evil]}}))
    evil = '/x"] permit fs.read paths ["/**'
    refused(load(tmp_path, home, {"filesystem": {"blacklist": [evil]}}))


@pytest.mark.parametrize("entry", ["!~/.ssh", "!/etc/shadow", "!**/.env"])
def test_a_blacklist_entry_cannot_negate(tmp_path: Path, home: Path, entry: str) -> None:
    refused(load(tmp_path, home, {"filesystem": {"blacklist": [entry]}}), "negated")


def test_defaults_survive_an_empty_or_shorter_blacklist(tmp_path: Path, home: Path) -> None:
    loaded = load(tmp_path, home, {"filesystem": {"blacklist": ["~/.kube", "~/.vault"]}})
    assert not loaded.problems
    assert [e.written for e in loaded.config.blacklist] == [
        *DEFAULT_BLACKLIST, *ENGINE_BLACKLIST, "~/.vault"]
    source = policy_source(loaded.config, (), "ls", "test")
    for secret in (f"{home}/.ssh/**", "/etc/shadow", "**/.env", f"{home}/.vault/**"):
        assert f'"{secret}"' in source
    assert "forbid mandatory" in source


@pytest.mark.parametrize(("value", "words"), [
    ("$UNSET_VAR/x", ["UNSET_VAR", "not set"]),
    ("$EMPTY_VAR/x", ["EMPTY_VAR", "empty"]),
    ("/a/$/b", ["starts no variable"]),
    ("/a/${BAD-NAME}", ["starts no variable"]),
    ("$NEWLINE_VAR", ["control character"]),
    ("$REL_VAR/sub", ["not an absolute path"]),
    ("$DOTS_VAR/x", ["`..`"]),
])
def test_variables_fail_closed(tmp_path: Path, home: Path, value: str,
                               words: list[str]) -> None:
    env = {"EMPTY_VAR": "", "NEWLINE_VAR": "/a\n/b", "REL_VAR": "rel", "DOTS_VAR": "/a/.."}
    for key in ("whitelist", "blacklist"):
        if key == "blacklist" and value.startswith("$REL_VAR"):
            continue  # a relative blacklist glob is refused by its own message
        refused(load(tmp_path, home, {"filesystem": {key: [value]}}, **env), *words)


def test_a_variable_value_is_not_expanded_again(tmp_path: Path, home: Path) -> None:
    (home / "proj" / "$HOME").mkdir()
    loaded = load(tmp_path, home, {"filesystem": {"whitelist": ["$P/$Q"]}},
                  P=str(home / "proj"), Q="$HOME")
    assert not loaded.problems  # `$HOME` from Q is literal text: the directory named `$HOME`
    assert [e.path for e in loaded.config.whitelist] == [f"{home}/proj/$HOME"]


@pytest.mark.parametrize(("raw", "line", "words"), [
    ('{"enabled": true,\n "enabled": false}', 2, ["duplicate"]),
    ('{"filesystem": {\n  "whitelist": [1]}}', 2, ["must be a path string"]),
    ('{"enabled": "yes"}', 1, ["true or false", "a string"]),
    ('{\n  "filesytem": {}}', 2, ["unknown key", "did you mean `filesystem`"]),
    ('{"filesystem": {"allowReadOutSide": true}}', 1, ["allowReadOutside"]),
    ('{"network": {"allowNetwork": 1}}', 1, ["true or false"]),
    ('[1, 2]', 1, ["JSON object"]),
    ('{"filesystem": {"whitelist": "/data"}}', 1, ["a list of path strings"]),
    ('{"enabled": true', 1, []),
    ('', 1, []),
])
def test_malformed_files_are_refused_at_their_place(tmp_path: Path, home: Path, raw: str,
                                                     line: int, words: list[str]) -> None:
    loaded = load(tmp_path, home, None, raw=raw)
    refused(loaded, *words)
    assert loaded.problems[0].span is not None
    assert loaded.problems[0].span.line == line


def test_input_is_bounded(tmp_path: Path, home: Path) -> None:
    big = '{"filesystem": {"blacklist": [' + ",".join(['"/x"'] * 60_000) + "]}}"
    assert len(big) > MAX_CONFIG_BYTES
    loaded = load(tmp_path, home, None, raw=big)
    assert loaded.fallback
    assert loaded.problems[0].id == "SBP106"
    many = {"filesystem": {"blacklist": [f"/x{i}" for i in range(MAX_ENTRIES + 1)]}}
    refused(load(tmp_path, home, many), f"at most {MAX_ENTRIES}")
    refused(load(tmp_path, home, {"filesystem": {"whitelist": ["/a" * 3000]}}), "characters")


def test_nesting_bomb_is_refused_not_a_recursion_error(tmp_path: Path, home: Path) -> None:
    loaded = load(tmp_path, home, None, raw="[" * 100_000 + "]" * 100_000)
    assert loaded.fallback
    assert loaded.problems


def test_network_cannot_be_turned_on(tmp_path: Path, home: Path) -> None:
    loaded = load(tmp_path, home, {"network": {"allowNetwork": True}})
    assert not loaded.problems
    assert not loaded.config.allow_network
    assert loaded.config.network_requested
    assert any("allowNetwork" in n and "ignored" in n for n in loaded.notes)
    policy = build_sandbox_policy(loaded.config, cwd=str(home / "proj"), tool="curl",
                                  home=str(home), state_dir=tmp_path / "st", origin="t")
    assert "network off" in policy.source
    assert "network on" not in policy.source


def test_enabled_switch_from_the_environment(tmp_path: Path, home: Path) -> None:
    assert not load(tmp_path, home, {}, POLICY_ENGINE_SANDBOX_ENABLED="0").config.enabled
    on = load(tmp_path, home, {"enabled": False}, POLICY_ENGINE_SANDBOX_ENABLED="true")
    assert on.config.enabled  # the environment outranks the file
    odd = load(tmp_path, home, {}, POLICY_ENGINE_SANDBOX_ENABLED="maybe")
    assert odd.config.enabled
    assert any("not a boolean" in n for n in odd.notes)


def test_location_env_xdg_and_default(tmp_path: Path) -> None:
    assert config_location({"POLICY_ENGINE_SANDBOX_CONFIG": "/c/s.json", "HOME": "/h"}) == (
        "/c/s.json", "$POLICY_ENGINE_SANDBOX_CONFIG")
    assert config_location({"XDG_CONFIG_HOME": "/x", "HOME": "/h"})[0] == \
        "/x/policy-engine/sandbox.json"
    assert config_location({"XDG_CONFIG_HOME": "rel", "HOME": "/h"})[0] == \
        "/h/.config/policy-engine/sandbox.json"
    seed = load_sandbox_config(env={"HOME": str(tmp_path), "SYNAPSE_SANDBOX_CONFIG": "/s.json"})
    assert not seed.found
    assert seed.path != "/s.json"
    assert any("SYNAPSE_SANDBOX_CONFIG" in n and "not read" in n for n in seed.notes)


def test_a_directory_or_fifo_as_config_is_refused_without_blocking(tmp_path: Path,
                                                                   home: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    loaded = load_sandbox_config(fifo, env={"HOME": str(home)})
    assert loaded.fallback
    assert loaded.problems[0].id == "SBP100"
    loaded = load_sandbox_config(tmp_path, env={"HOME": str(home)})
    assert loaded.fallback
    assert loaded.problems[0].id == "SBP100"


def test_check_takes_a_sandbox_config(tmp_path: Path, home: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from policy_engine.cli.main import cli

    monkeypatch.setenv("HOME", str(home))
    bad = tmp_path / "sandbox.json"
    bad.write_text('{\n  "enabled": true,\n'
                   '  "filesystem": {"whitelist": ["~"], "blacklst": []}\n}\n')
    good = tmp_path / "ok.json"
    good.write_text(json.dumps({"filesystem": {"whitelist": [str(home / "proj")]}}))
    res = CliRunner().invoke(cli, ["check", str(bad), str(good)])
    assert res.exit_code == 1, res.output
    assert f"{bad}:3:32: SBP105 `filesystem.whitelist[0]`" in res.output
    assert f"{bad}:3:38: SBP105 unknown key `filesystem.blacklst`" in res.output
    assert "did you mean `blacklist`?" in res.output
    assert str(good) not in res.output.replace("2 file(s)", "")
    res = CliRunner().invoke(cli, ["sandbox", "check", str(good)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("value", ["relative/home", "", "~"])
def test_an_unusable_home_is_replaced_by_the_accounts_not_a_crash(tmp_path: Path,
                                                                  value: str) -> None:
    import pwd

    loaded = load_sandbox_config(tmp_path / "none.json", env={"HOME": value})
    account = pwd.getpwuid(os.getuid()).pw_dir
    assert loaded.config.blacklist[0].path == f"{account}/.ssh"
    assert any("HOME" in n for n in loaded.notes)


def test_a_huge_variable_value_is_refused(tmp_path: Path, home: Path) -> None:
    refused(load(tmp_path, home, {"filesystem": {"whitelist": ["$BIG/x"]}}, BIG="/a" * 5000),
            "characters")


@pytest.mark.parametrize(("key", "entry"), [
    ("whitelist", "$TOKEN"), ("whitelist", "/data/$TOKEN/*"), ("whitelist", "/etc/${TOKEN}"),
    ("whitelist", "/data/$TOKEN/../x"), ("blacklist", "$TOKEN"), ("blacklist", "/a/$TOKEN/x**"),
])
def test_a_refused_entry_never_echoes_a_variables_value(tmp_path: Path, home: Path, key: str,
                                                       entry: str) -> None:
    # a config naming a secret variable must not copy its value into stderr or the evidence
    loaded = load(tmp_path, home, {"filesystem": {key: [entry]}}, TOKEN="ghp_S3CRETvalue")
    text = refused(loaded, "TOKEN")
    assert "S3CRET" not in text


def test_disabled_runs_only_on_an_explicit_compat_local_backend(tmp_path: Path,
                                                                home: Path) -> None:
    from policy_engine.config import EngineConfig
    from policy_engine.model import OpKind
    from policy_engine.sandbox_runner.runner import disabled_refusal

    off = load(tmp_path, home, {"enabled": False})
    assert off.config.enabled_origin == f"{tmp_path / 'sandbox.json'}:2:3"
    why = disabled_refusal(off, EngineConfig())
    assert why is not None
    assert "sandbox.json:2:3" in why
    assert "unconfined" in why
    local = {OpKind.PROC_EXEC: "local"}
    assert disabled_refusal(off, EngineConfig(backends=local)) is not None  # strict: refused
    assert disabled_refusal(off, EngineConfig(mode="compat")) is not None  # still bwrap
    assert disabled_refusal(off, EngineConfig(backends=local, mode="compat")) is None
    assert disabled_refusal(load(tmp_path, home, {}), EngineConfig()) is None


@pytest.mark.parametrize("doc", [
    {}, {"filesystem": {"allowReadOutside": True}},
    {"filesystem": {"blacklist": [f"/very/long/path/number/{i}" for i in range(30)]}},
])
def test_the_generated_policy_is_in_the_canonical_layout(tmp_path: Path, home: Path,
                                                         doc: dict[str, Any]) -> None:
    from click.testing import CliRunner

    from policy_engine.cli.main import cli

    loaded = load(tmp_path, home, doc)
    assert not loaded.problems
    policy = build_sandbox_policy(loaded.config, cwd=str(home / "proj"), tool="bash",
                                  home=str(home), state_dir=tmp_path / "st", origin="t")
    res = CliRunner().invoke(cli, ["fmt", "--check", str(policy.path)])
    assert res.exit_code == 0, res.output
    lint = CliRunner().invoke(cli, ["check", str(policy.path)])
    assert lint.exit_code == 0, lint.output
