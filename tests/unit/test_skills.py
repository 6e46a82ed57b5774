"""Skill manifests: the schema, `skills check` diagnostics, compiling to a tool manifest that
the policy meet decides, and input validation (JSON pointers, linear-time patterns)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler import compile_files
from policy_engine.explain import ExplainRequest, explain
from policy_engine.model import FsReadOp, Grant, NetworkMode, ProcExecOp, SideEffect
from policy_engine.skills.check import check_dir, load_skills, manifest_schema
from policy_engine.skills.invoke import InputError, validate_inputs
from policy_engine.skills.jsonpos import JsonSyntaxError, parse

REPO = Path(__file__).resolve().parents[2]
SKILLS = REPO / "skills"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", "skills", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def _write(root: Path, dirname: str, doc: dict[str, Any] | str) -> Path:
    (root / dirname).mkdir(parents=True, exist_ok=True)
    path = root / dirname / "manifest.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return path


def _shell() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SKILLS / "shell.run" / "manifest.json").read_text())
    return doc


def test_the_shipped_skills_check_clean_and_the_repo_schema_is_the_engine_one() -> None:
    skills, diags = check_dir(SKILLS)
    assert diags == []
    assert {s.id for s in skills} >= {"shell.run", "python.run", "http.fetch", "docs.browse",
                                      "files.read"}
    repo_schema = json.loads((SKILLS / "_schema" / "manifest.schema.json").read_text())
    assert repo_schema == manifest_schema()
    done = _cli("check", str(SKILLS))
    assert done.returncode == 0, done.stderr
    assert "5 skill(s) ok" in done.stdout


def test_check_points_at_each_problem(tmp_path: Path) -> None:
    doc = _shell()
    doc["runtime"]["kind"] = "podman"
    doc["permissions"]["fs"]["read"] = ["/etc/**", "inputs/../x"]
    path = _write(tmp_path, "shell.run", doc)
    text = path.read_text().splitlines()
    done = _cli("check", str(tmp_path))
    assert done.returncode == 1
    kind_line = next(i for i, line in enumerate(text, 1) if '"podman"' in line)
    col = text[kind_line - 1].index('"podman"') + 1
    assert f"{path}:{kind_line}:{col}: SBP431 /runtime/kind:" in done.stderr
    assert "`/etc/**` is not a path beneath inputs/, work/ or artifacts/" in done.stderr
    assert "`inputs/../x` is not a path beneath" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d.update(id="other.name"), "SBP432 id `other.name` is in directory `shell.run`"),
    (lambda d: d.update(id="Shell_Run"), "SBP431 /id: `Shell_Run` is not a dotted"),
    (lambda d: d["permissions"]["net"].update(mode="restricted", hosts=["x.org"]),
     "SBP431 /permissions/net/mode"),
    (lambda d: d["permissions"]["net"].update(mode="on"), "SBP431 /permissions/net/mode"),
    (lambda d: d["runtime"].update(args=["{nope}"]), "SBP433 argument `{nope}` names no"),
    (lambda d: d["interface"]["inputs"].update(required=[]),
     "SBP433 argument `{script}` names input `script`, which"),
    (lambda d: d["limits"].update(cpu_cores=0), "SBP431 /limits/cpu_cores"),
    (lambda d: d["interface"]["inputs"]["properties"]["script"].update(pattern="(a)\\1"),
     "SBP435 /interface/inputs/properties/script/pattern"),
    (lambda d: d["interface"]["inputs"].update({"$ref": "https://example.org/s.json"}),
     "SBP435 /interface/inputs/$ref"),
    (lambda d: d["interface"]["inputs"].update(patternProperties={"^x": {}}),
     "SBP435 /interface/inputs/patternProperties"),
    (lambda d: d.pop("limits"), "SBP431 /: 'limits' is a required property"),
])
def test_check_refuses(tmp_path: Path, change: Any, expected: str) -> None:
    doc = _shell()
    change(doc)
    _write(tmp_path, "shell.run", doc)
    _, diags = check_dir(tmp_path)
    rendered = [f"{d.id} {d.message}" for d in diags]
    assert any(r.startswith(expected) for r in rendered), rendered


def test_syntax_errors_and_unusable_directories(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.b", '{\n  "id": "a.b",\n  "id": "a.c"\n}\n')
    done = _cli("check", str(tmp_path))
    assert done.returncode == 1
    assert f"{path}:3:3: SBP430 duplicate key `id`" in done.stderr
    (tmp_path / "c.d").mkdir()
    assert "SBP434 `c.d/` has no manifest.json" in _cli("check", str(tmp_path)).stderr
    missing = _cli("check", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert "SBP434" in missing.stderr
    with pytest.raises(JsonSyntaxError) as caught:
        parse('{"a": [1, 2,, 3]}')
    assert (caught.value.line, caught.value.column) == (1, 13)
    located = parse('{\n  "a": {"b/c": [true, {"d": 1}]}\n}')
    assert located.position("/a/b~1c/1/d") == (2, 29)


def test_a_skill_compiles_to_a_tool_manifest_the_policy_meet_decides(tmp_path: Path) -> None:
    skills = load_skills(SKILLS)
    shell = skills["shell.run"].tool_manifest("/data")
    assert shell.name == "shell.run"
    assert shell.network is NetworkMode.OFF
    assert set(shell.side_effects) == {SideEffect.PROCESS, SideEffect.READ, SideEffect.WRITE}
    assert shell.limits.timeout_ms == 60_000
    reader = skills["files.read"]
    manifest = reader.tool_manifest("/data")
    paths = {p for cap in manifest.permissions if cap.kind == "fs.read" for p in cap.paths}
    assert paths == {"/data/inputs/**", "/data/work/**", "/data/artifacts/**"}
    policy = tmp_path / "p.sbpolicy"
    policy.write_text('policy "t" version "1.0.0"\n'
                      'permit "all" fs.read paths ["/data/**"]\n'
                      'permit "sh" proc.exec tool "bash"\n'
                      # the guard decides a proc.exec's cwd: it must be a readable path
                      'permit "ws" fs.read, fs.list, fs.write paths ["/workspace/**"]\n'
                      'require consent when `profile.safety == "High"`\n')
    policyset = compile_files([policy])
    grant = Grant.model_validate({"tenant": "t", "subject_id": "s", "tool_name": "files.read",
                                  "call_id": "c", "expires_at": 4102444800000,
                                  "capabilities": reader.capabilities("/data")})
    inside = explain(policyset, manifest, grant, ExplainRequest(
        op=FsReadOp(path="/data/inputs/a.txt")))
    # the policy permits /data/**, the skill only its three directories: the meet narrows
    outside = explain(policyset, manifest, grant, ExplainRequest(
        op=FsReadOp(path="/data/secret.txt")))
    assert inside.to_json()["decision"] == "allow"
    assert outside.to_json()["decision"] == "deny"
    # a process skill's argv is its entrypoint plus the one placeholder argument
    sh = skills["shell.run"]
    grant_sh = grant.model_copy(update={"tool_name": "shell.run",
                                        "capabilities": tuple(shell.permissions)})
    ok = explain(policyset, shell, grant_sh, ExplainRequest(
        op=ProcExecOp(tool="bash", args=("-lc", "echo hi\nls"), cwd="/workspace/work")))
    extra = explain(policyset, shell, grant_sh, ExplainRequest(
        op=ProcExecOp(tool="bash", args=("-c", "id"), cwd="/workspace/work")))
    assert sh.kind == "docker"
    assert ok.to_json()["decision"] == "allow"
    assert extra.to_json()["decision"] == "deny"


def test_inputs_are_checked_with_pointers_and_linear_time_patterns(tmp_path: Path) -> None:
    skills = load_skills(SKILLS)
    with pytest.raises(InputError) as caught:
        validate_inputs(skills["files.read"], {"path": 5})
    assert caught.value.pointer == "/path"
    with pytest.raises(InputError) as caught:
        validate_inputs(skills["shell.run"], {})
    assert (caught.value.pointer, caught.value.message) == ("", "required: `script`")
    # a backtracking engine takes seconds on this (2^27 paths); RE2 answers at once
    shutil.copytree(SKILLS, tmp_path / "skills")
    path = tmp_path / "skills" / "files.read" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["interface"]["inputs"]["properties"]["path"]["pattern"] = "^(inputs|(a+)+)$"
    path.write_text(json.dumps(doc))
    slow = load_skills(tmp_path / "skills")["files.read"]
    started = time.perf_counter()
    with pytest.raises(InputError) as caught:
        validate_inputs(slow, {"path": "a" * 27 + "!"})
    assert time.perf_counter() - started < 0.5
    assert caught.value.pointer == "/path"
