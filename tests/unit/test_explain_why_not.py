"""Explain says why not: the failing dimension of each permit, every refusing layer, and the
consent rule that required consent."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.main import cli
from policy_engine.compiler import compile_files
from policy_engine.explain import ExplainRequest, explain
from policy_engine.explain.render_text import render_text
from policy_engine.graph import PolicySet
from policy_engine.model import (
    BrowserCapability,
    FsCapability,
    Grant,
    Manifest,
    NetHttpCapability,
)

FAR = 4_102_444_800_000
NOW = 1_795_000_000_000


def compile_text(tmp_path: Path, text: str) -> PolicySet:
    path = tmp_path / "p.sbpolicy"
    path.write_text('policy "t" version "1.0.0"\n' + text)
    return compile_files([path])


def run(ps: PolicySet, op: dict[str, object], granted: tuple[object, ...],
        declared: tuple[object, ...] | None = None,
        side_effects: tuple[str, ...] = ()) -> dict[str, object]:
    manifest = Manifest(name="tool", version="1", permissions=declared or granted, network="on",
                        side_effects=side_effects)
    grant = Grant(tenant="t", subject_id="agent:a", tool_name="tool", call_id="c",
                  capabilities=granted, expires_at=FAR)
    exp = explain(ps, manifest, grant, ExplainRequest.model_validate({"op": op, "now_ms": NOW}))
    out = exp.to_json()
    out["text"] = render_text(exp)
    return out


def details(out: dict[str, object], node: str) -> list[str]:
    trace = out["trace"]
    assert isinstance(trace, list)
    return [s["detail"] for s in trace if s["node"] == node]


def test_each_permit_names_the_failing_dimension_and_value(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, '''
permit "by-method" net.http hosts ["api.example.com"] methods ["GET"]
permit "by-host" net.http hosts ["other.example.com"] methods ["POST"]
permit "by-scheme" net.http hosts ["api.example.com"] schemes ["http"] methods ["POST"]
permit "by-port" net.http hosts ["api.example.com"] ports [8443] methods ["POST"]
''')
    op = {"kind": "net.http", "method": "post", "url": "https://api.example.com/v1"}
    out = run(ps, op, (NetHttpCapability(hosts=("*",), methods=("GET", "POST"),
                                         ports=(80, 443, 8443), schemes=("http", "https")),))
    assert out["decision"] == "deny"
    assert details(out, "permit") == [
        "method `POST` is not in methods [GET]",
        "host `api.example.com` is not in hosts [other.example.com]",
        "scheme `https` is not in schemes [http]",
        "port 443 is not in ports [8443]",
    ]


def test_argv_slot_path_and_scope_are_named(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, '''
permit "git" proc.exec tool "git" args ["status" | "log", /^--oneline$/ ...]
permit "ws" fs.read paths ["/workspace/**"]
permit "docs" browser.use hosts ["docs.python.org"] scopes [open]
''')
    from policy_engine.model import ProcCapability

    out = run(ps, {"kind": "proc.exec", "tool": "git", "args": ["log", "--stat"]},
              (ProcCapability(tool="git"),))
    # the argument itself is not echoed (explain output is logged): its size stands for it
    assert details(out, "permit") == ["argument 2 (6 characters) is not allowed by the template"]
    out = run(ps, {"kind": "fs.read", "path": "/etc/hosts"},
              (FsCapability(kind="fs.read", paths=("/**",)),))
    assert details(out, "permit") == ["path `/etc/hosts` is not under paths [/workspace/**]"]
    out = run(ps, {"kind": "browser.nav", "url": "https://docs.python.org/3/"},
              (BrowserCapability(hosts=("docs.python.org",), scopes=("open", "extract")),))
    assert out["decision"] == "deny"
    assert "scope `extract` is not in scopes [open]" in details(out, "layer:policy")[0]


def test_a_deny_lists_every_refusing_layer_and_the_consent_rule(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, '''
permit "read-ws" fs.read paths ["/workspace/**"] limits { bytes_in 4B }
require consent when `request.path.endsWith(".md")`
''')
    op = {"kind": "fs.read", "path": "/workspace/notes.md", "len": 100}
    out = run(ps, op, (FsCapability(kind="fs.read", paths=("/other/**",)),),
              (FsCapability(kind="fs.read", paths=("/workspace/**",)),))
    assert out["code"] == "SANDBOX.PERMISSION_DENY"  # the first refusal decides
    assert out["refused_by"] == ["grant", "limits", "consent"]
    assert details(out, "layer:limits") == ["read length 100 exceeds the limit 4"]
    [consent] = details(out, "layer:consent")
    assert consent == "consent required by consent rule `consent:p:4`"
    assert "  refused:  by grant, limits, consent" in str(out["text"])
    # with the grant fixed, consent is what refuses, and its step names the rule
    out = run(ps, {"kind": "fs.read", "path": "/workspace/notes.md"},
              (FsCapability(kind="fs.read", paths=("/workspace/**",)),))
    assert out["reason"] == "consent required by consent rule `consent:p:4`"
    steps = [s for s in out["trace"] if s["node"] == "consent"]
    assert steps[0]["outcome"] == "fail"
    assert steps[0]["rule"]["id"] == "consent:p:4"
    assert out["refused_by"] == ["consent"]


def test_the_builtin_consent_rule_is_named(tmp_path: Path) -> None:
    ps = compile_text(tmp_path, 'permit fs.write paths ["/workspace/**"]\n')
    out = run(ps, {"kind": "fs.write", "path": "/workspace/a", "bytes_b64": ""},
              (FsCapability(kind="fs.write", paths=("/workspace/**",)),), side_effects=("Write",))
    assert out["reason"] == ("consent required by the built-in consent rule (High safety, or "
                             "Write/Process side effects)")
    [step] = [s for s in out["trace"] if s["node"] == "consent"]
    assert step["rule"]["file"] == "<builtin>"


def test_cli_explain_text_shows_the_layers(tmp_path: Path) -> None:
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "t" version "1"\npermit "ws" fs.read paths ["/workspace/**"]\n')
    grant = Grant(tenant="t", subject_id="a", tool_name="tool", call_id="c", expires_at=FAR,
                  capabilities=(FsCapability(kind="fs.read", paths=("/workspace/**",)),))
    manifest = Manifest(name="tool", version="1", permissions=grant.capabilities)
    (tmp_path / "g.json").write_text(grant.model_dump_json())
    (tmp_path / "m.json").write_text(manifest.model_dump_json())
    (tmp_path / "r.json").write_text(json.dumps(
        {"op": {"kind": "fs.read", "path": "/srv/x"}, "now_ms": NOW}))
    result = CliRunner().invoke(cli, [
        "explain", "--policy", str(policy), "--grant", str(tmp_path / "g.json"),
        "--manifest", str(tmp_path / "m.json"), "--request", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "refused:  by policy, manifest, grant" in result.output
    assert "permit        no-match        ws (" in result.output
    assert "path `/srv/x` is not under paths [/workspace/**]" in result.output
