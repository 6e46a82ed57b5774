"""The guard decides a call's environment, its HTTP headers and method: explain answers as a run.

Each case goes through the compiler (the `env` clause of the language), the profile builder (the
meet with grant and manifest) and the guard, via ``explain`` and the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.compiler import check_files, compile_files
from policy_engine.explain import ExplainRequest, explain
from policy_engine.graph import PolicySet
from policy_engine.model import (
    ArgAlternative,
    Grant,
    Manifest,
    NetHttpCapability,
    ProcCapability,
)

FAR = 4_102_444_800_000
NOW = 1_795_000_000_000
POLICY = '''policy "t" version "1.0.0"
permit "git-ro" proc.exec tool "git" args ["status" | "log"] env ["LANG", /^LC_/, "GIT_DIR"]
permit "env-none" proc.exec tool "env"
permit "api" net.http hosts ["api.example.com"] methods ["GET", "POST"]
'''


def compile_text(tmp_path: Path, text: str = POLICY) -> PolicySet:
    path = tmp_path / "p.sbpolicy"
    path.write_text(text)
    return compile_files([path])


def tools(*caps: object) -> tuple[Manifest, Grant]:
    manifest = Manifest(name="shell", version="1", permissions=caps, network="on")
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="shell", call_id="c",
                  capabilities=caps, expires_at=FAR)
    return manifest, grant


def decide(ps: PolicySet, op: dict[str, object], *caps: object) -> tuple[str | None, str]:
    manifest, grant = tools(*(caps or (ProcCapability(tool="git"), ProcCapability(tool="env"),
                                       NetHttpCapability(hosts=("api.example.com",),
                                                         methods=("GET", "POST")))))
    exp = explain(ps, manifest, grant, ExplainRequest.model_validate({"op": op, "now_ms": NOW}))
    return exp.decision.code, exp.decision.reason


def git(env: dict[str, str], *args: str) -> dict[str, object]:
    return {"kind": "proc.exec", "tool": "git", "args": list(args or ("status",)), "env": env}


@pytest.mark.parametrize("env", [
    {"GIT_CONFIG_PARAMETERS": "'core.fsmonitor'='touch /tmp/pwn'"},
    {"LD_PRELOAD": "/tmp/evil.so"},
    {"GIT_SSH_COMMAND": "touch /tmp/pwn"},
    {"PATH": "/tmp/evil:/usr/bin"},
    {"PYTHONPATH": "/tmp/evil"},
    {"BASH_ENV": "/tmp/evil.sh"},
    {"NODE_OPTIONS": "--require /tmp/evil.js"},
    {"HOME": "/workspace/evil"},
    {"LC_ALL": "C", "GIT_CONFIG_COUNT": "1"},
    {"http_proxy": "http://evil:3128"},
])
def test_hijack_variables_are_refused_even_where_a_regex_would_admit(
        tmp_path: Path, env: dict[str, str]) -> None:
    ps = compile_text(tmp_path, POLICY + 'permit "loose" proc.exec tool "git" env [/.*/]\n')
    code, reason = decide(ps, git(env))
    assert code == "SANDBOX.CAPABILITY_BLOCKED"
    assert "can hijack" in reason


def test_a_hijack_variable_named_exactly_by_the_rule_is_allowed(tmp_path: Path) -> None:
    assert decide(compile_text(tmp_path), git({"GIT_DIR": "/workspace/.git"})) == (None, "")


def test_listed_names_and_searched_regexes_are_allowed(tmp_path: Path) -> None:
    assert decide(compile_text(tmp_path), git({"LANG": "C.UTF-8", "LC_TIME": "C"})) == (None, "")


def test_a_name_outside_the_list_is_refused_naming_it(tmp_path: Path) -> None:
    code, reason = decide(compile_text(tmp_path), git({"FOO": "1"}))
    assert code == "SANDBOX.CAPABILITY_BLOCKED"
    assert reason == "environment variable `FOO` is not in the `env` allow-list of rule `git-ro`"


def test_a_rule_without_env_allows_no_variable(tmp_path: Path) -> None:
    op = {"kind": "proc.exec", "tool": "env", "args": [], "env": {"LANG": "C"}}
    code, reason = decide(compile_text(tmp_path), op)
    assert code == "SANDBOX.CAPABILITY_BLOCKED"
    assert "rule `env-none` has no `env` allow-list" in reason
    del op["env"]
    assert decide(compile_text(tmp_path), op) == (None, "")


def test_a_grant_env_list_narrows_the_rule(tmp_path: Path) -> None:
    narrow = ProcCapability(tool="git", env=(ArgAlternative(literal="LANG"),))
    ps = compile_text(tmp_path)
    assert decide(ps, git({"LANG": "C"}), narrow) == (None, "")
    code, _ = decide(ps, git({"LC_TIME": "C"}), narrow)
    assert code == "SANDBOX.CAPABILITY_BLOCKED"


def test_a_manifest_cannot_lift_the_hijack_refusal(tmp_path: Path) -> None:
    wide = ProcCapability(tool="git", env=(ArgAlternative(literal="LD_PRELOAD"),))
    code, reason = decide(compile_text(tmp_path), git({"LD_PRELOAD": "/x.so"}), wide)
    assert code == "SANDBOX.CAPABILITY_BLOCKED"
    assert "rule `git-ro`" in reason


@pytest.mark.parametrize(("env", "why"), [
    ({"A=B": "1"}, "name 'A=B' is malformed"),
    ({"": "1"}, "name '' is malformed"),
    ({"LANG": "a\x00b"}, "`LANG` is malformed"),
    ({"LANG": "x" * 40_000}, "is 40000 bytes; at most 32768"),
])
def test_malformed_env_is_a_schema_error(tmp_path: Path, env: dict[str, str], why: str) -> None:
    code, reason = decide(compile_text(tmp_path), git(env))
    assert code == "SCHEMA.VALIDATION_FAILED"
    assert why in reason


def test_stdin_is_decided_against_max_bytes_in(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, POLICY.replace(
        '"GIT_DIR"]', '"GIT_DIR"] limits { bytes_in 4B }'))
    op = {"kind": "proc.exec", "tool": "git", "args": ["status"], "stdin_b64": "aGVsbG8="}
    assert decide(ps, op) == ("SANDBOX.CAPABILITY_BLOCKED",
                             "stdin size 5 exceeds the limit 4 (set by rule)")
    op["stdin_b64"] = "not base64!"
    assert decide(ps, op)[0] == "SCHEMA.VALIDATION_FAILED"


def http(headers: dict[str, str], method: str = "GET") -> dict[str, object]:
    return {"kind": "net.http", "method": method, "url": "https://api.example.com/v1",
            "headers": headers}


@pytest.mark.parametrize(("headers", "code", "why"), [
    ({"Host": "evil.com"}, "SANDBOX.CAPABILITY_BLOCKED", "`Host` may not be set"),
    ({"host": "evil.com"}, "SANDBOX.CAPABILITY_BLOCKED", "`host` may not be set"),
    ({"Transfer-Encoding": "chunked"}, "SANDBOX.CAPABILITY_BLOCKED", "hop-by-hop"),
    ({"Connection": "close"}, "SANDBOX.CAPABILITY_BLOCKED", "hop-by-hop"),
    ({"Proxy-Authorization": "Basic x"}, "SANDBOX.CAPABILITY_BLOCKED", "hop-by-hop"),
    ({"Upgrade": "websocket"}, "SANDBOX.CAPABILITY_BLOCKED", "hop-by-hop"),
    ({"Content-Length": "0"}, "SANDBOX.CAPABILITY_BLOCKED", "sets it from the body"),
    ({"X-A": "a\r\nHost: evil.com"}, "SCHEMA.VALIDATION_FAILED", "has CR/LF in its value"),
    ({"X-A": "a\nb"}, "SCHEMA.VALIDATION_FAILED", "has CR/LF in its value"),
    ({"X-A": "a\x00b"}, "SCHEMA.VALIDATION_FAILED", "has NUL in its value"),
    ({"X-A": "a\x7fb"}, "SCHEMA.VALIDATION_FAILED", "has a control character"),
    ({"X-A": "caf\u00e9"}, "SCHEMA.VALIDATION_FAILED", "has a non-ASCII character"),
    ({"X A": "1"}, "SCHEMA.VALIDATION_FAILED", "is not a token"),
    ({"X-A:": "1"}, "SCHEMA.VALIDATION_FAILED", "is not a token"),
])
def test_request_headers_are_decided(tmp_path: Path, headers: dict[str, str], code: str,
                                     why: str) -> None:
    got_code, reason = decide(compile_text(tmp_path), http(headers))
    assert got_code == code
    assert why in reason


def test_field_values_with_space_and_tab_pass(tmp_path: Path) -> None:
    assert decide(compile_text(tmp_path), http({"Accept": "a/b,\tc/d; q=0.5"})) == (None, "")


def test_the_method_is_upper_cased_and_must_be_a_token(tmp_path: Path) -> None:
    ps = compile_text(tmp_path)
    assert decide(ps, http({}, "post")) == (None, "")
    assert decide(ps, http({}, "G ET"))[0] == "SCHEMA.VALIDATION_FAILED"
    assert decide(ps, http({}, "\u00dfET"))[0] == "SCHEMA.VALIDATION_FAILED"


def test_env_clause_diagnostics(tmp_path: Path) -> None:
    path = tmp_path / "p.sbpolicy"
    path.write_text('policy "t" version "1"\n'
                    'permit proc.exec tool "git" env ["A-B", /(/]\n'
                    'forbid proc.exec tool "rm" env ["LANG"]\n'
                    'permit fs.read paths ["/w/**"] env ["LANG"]\n')
    found = sorted((d.id, d.span.line if d.span else 0) for d in check_files([path]))
    assert found == [("SBP208", 2), ("SBP212", 3), ("SBP212", 4), ("SBP213", 2)]


@pytest.mark.parametrize("env", [
    {"GIT_CONFIG_PARAMETERS": "'core.fsmonitor'='touch /tmp/pwn'"},
    {"LD_PRELOAD": "/tmp/x.so"}, {"GIT_SSH_COMMAND": "sh -c id"}, {"PATH": "/tmp"},
    {"GIT_DIR": "/tmp/evil"},
])
def test_cli_explain_refuses_the_hijack_env(tmp_path: Path, env: dict[str, str]) -> None:
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(POLICY.replace(', "GIT_DIR"', ""))
    manifest, grant = tools(ProcCapability(tool="git"))
    (tmp_path / "m.json").write_text(manifest.model_dump_json())
    (tmp_path / "g.json").write_text(grant.model_dump_json())
    (tmp_path / "r.json").write_text(json.dumps({"op": git(env), "now_ms": NOW}))
    result = CliRunner().invoke(cli, [
        "explain", "--policy", str(policy), "--manifest", str(tmp_path / "m.json"),
        "--grant", str(tmp_path / "g.json"), "--request", str(tmp_path / "r.json"),
        "--format", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["decision"] == "deny"
    assert out["code"] == "SANDBOX.CAPABILITY_BLOCKED"
    assert f"`{next(iter(env))}` can hijack" in out["reason"]
    env_step = next(s for s in out["trace"] if s["node"] == "env")
    assert env_step["outcome"] == "fail"
    assert env_step["rule"]["id"] == "git-ro"
    assert out["refused_by"] == ["policy"]


def test_executors_second_line_reads_the_profile_env_lists(tmp_path: Path) -> None:
    from plugins.executor_docker.executor import _env as docker_env
    from plugins.executor_proc.spec import build_env
    from policy_engine import PolicyEngineError
    from policy_engine.model import ProcExecOp

    manifest, grant = tools(ProcCapability(tool="git"))
    exp = explain(compile_text(tmp_path), manifest, grant,
                  ExplainRequest.model_validate({"op": git({"LANG": "C"}), "now_ms": NOW}))
    profile = exp.profile
    assert profile is not None
    assert docker_env({"LANG": "C"}, profile, "git")["LANG"] == "C"
    op = ProcExecOp(tool="git", args=("status",), env={"LANG": "C"})
    assert build_env(profile, op, (), {}, "/tmp")["LANG"] == "C"
    for bad in ({"LD_PRELOAD": "/x.so"}, {"FOO": "1"}):
        with pytest.raises(PolicyEngineError) as exc:
            docker_env(bad, profile, "git")
        assert exc.value.code.value == "SANDBOX.CAPABILITY_BLOCKED"
        with pytest.raises(PolicyEngineError) as exc:
            build_env(profile, op.model_copy(update={"env": bad}), (), {}, "/tmp")
        assert exc.value.code.value == "SANDBOX.CAPABILITY_BLOCKED"
