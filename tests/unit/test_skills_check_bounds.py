"""Attack round 32, L4: manifests `skills check` passed but whose every invoke answered 500
`UNKNOWN.INTERNAL` (`"$ref": "#"`, an in-place reference loop, recursed without end; a limit
written `1e308` failed the limits model) are refused by `skills check` with a located error
(file:line:col, the code, the JSON pointer), and `serve`/`mcp --skills` refuse them at start
with the same message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from policy_engine.skills.check import check_dir

REPO = Path(__file__).resolve().parents[2]


def _reader() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((REPO / "skills/files.read/manifest.json").read_text())
    return doc


def _write(root: Path, doc: dict[str, Any]) -> Path:
    (root / doc["id"]).mkdir(parents=True)
    path = root / doc["id"] / "manifest.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd=REPO)


def _self_ref(d: dict[str, Any]) -> None:
    d["interface"]["inputs"]["$ref"] = "#"


def _loop(d: dict[str, Any]) -> None:
    d["interface"]["inputs"]["$defs"] = {"a": {"$ref": "#/$defs/b"},
                                         "b": {"allOf": [{"$ref": "#/$defs/a"}]}}
    d["interface"]["inputs"]["properties"]["path"]["$ref"] = "#/$defs/a"


def _blowup(d: dict[str, Any]) -> None:  # no loop, but 2^30 evaluations of one value
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
            for i in range(30)}
    defs["d30"] = {"type": "string"}
    d["interface"]["inputs"]["$defs"] = defs
    d["interface"]["inputs"]["properties"]["path"]["$ref"] = "#/$defs/d0"


def _dangling(d: dict[str, Any]) -> None:
    d["interface"]["inputs"]["properties"]["path"]["$ref"] = "#/$defs/nowhere"


def _huge_timeout(d: dict[str, Any]) -> None:
    d["limits"]["timeout_ms"] = 1e308


def _huge_bytes(d: dict[str, Any]) -> None:
    d["limits"]["max_bytes_in"] = 1e40


@pytest.mark.parametrize(("change", "needle", "expected"), [
    (_self_ref, '"$ref": "#"', "SBP435 /interface/inputs/$ref: "),
    (_loop, None, "SBP435 /interface/inputs/$defs/"),
    (_blowup, None, "SBP435 /interface/inputs/$defs/d"),
    (_dangling, '"#/$defs/nowhere"', "SBP435 /interface/inputs/properties/path/$ref: "),
    (_huge_timeout, '"timeout_ms"', "SBP431 /limits/timeout_ms: "),
    (_huge_bytes, '"max_bytes_in"', "SBP431 /limits/max_bytes_in: "),
])
def test_check_refuses_with_a_located_error(tmp_path: Path, change: Any, needle: str | None,
                                            expected: str) -> None:
    doc = _reader()
    change(doc)
    path = _write(tmp_path, doc)
    _, diags = check_dir(tmp_path)
    rendered = [f"{d.id} {d.message}" for d in diags]
    assert any(r.startswith(expected) for r in rendered), rendered
    done = _run("skills", "check", str(tmp_path))
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stderr
    hit = next(line for line in done.stderr.splitlines() if expected.split()[0] in line)
    assert hit.startswith(f"{path}:"), hit
    if needle is not None:  # else the place is one of the loop's references
        assert hit.startswith(f"{path}:{_line_of(path, needle)}:"), hit


@pytest.mark.parametrize("face", ["serve", "mcp"])
def test_serve_and_mcp_refuse_such_skills_at_start(tmp_path: Path, face: str) -> None:
    doc = _reader()
    _self_ref(doc)
    path = _write(tmp_path / "skills", doc)
    policy = tmp_path / "p.sbpolicy"
    policy.write_text(f'policy "p" version "1.0.0"\npermit "r" fs.read paths ["{tmp_path}/**"]\n')
    extra = ["--port", "0"] if face == "serve" else ["--tenant", "acme", "--subject", "agent:a"]
    done = _run(face, "--policy", str(policy), "--state-dir", str(tmp_path / "state"),
                "--skills", str(tmp_path / "skills"), *extra)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert f"{path}:{_line_of(path, chr(34) + '$ref' + chr(34))}:" in done.stderr, done.stderr
    assert "SBP435 /interface/inputs/$ref: " in done.stderr
