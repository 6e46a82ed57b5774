"""Manifest and grant loaders: JSON, YAML and `.sbpolicy`, with positioned SBP105 errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from policy_engine.compiler.loaders import (
    PositionLookup,
    field_path,
    load_document,
    load_grant,
    load_manifest,
)
from policy_engine.errors import DiagnosticsError
from policy_engine.model import FsCapability, SafetyClass

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"

GRANT = {
    "tenant": "acme", "subject_id": "agent:1", "tool_name": "git", "call_id": "c1",
    "expires_at": 1_900_000_000_000,
    "capabilities": [{"kind": "fs.read", "paths": ["/workspace/**"]}],
}
MANIFEST = {"name": "git", "version": "1.0", "safety_class": "High",
            "permissions": [{"kind": "proc.exec", "tool": "git"}]}


def _errors(fn: object, path: Path) -> list[tuple[str, int, int, str]]:
    with pytest.raises(DiagnosticsError) as info:
        fn(path)  # type: ignore[operator]
    return [(d.id, d.span.line if d.span else 0, d.span.column if d.span else 0, d.message)
            for d in info.value.diagnostics]


def test_grant_from_json_and_yaml(tmp_path: Path) -> None:
    j, y = tmp_path / "g.json", tmp_path / "g.yaml"
    j.write_text(json.dumps(GRANT, indent=2))
    y.write_text(yaml.safe_dump(GRANT))
    assert load_grant(j) == load_grant(y)
    assert load_grant(j).capabilities[0] == FsCapability(kind="fs.read", paths=("/workspace/**",))


def test_manifest_from_json_yaml_and_sbpolicy(tmp_path: Path) -> None:
    j = tmp_path / "m.json"
    j.write_text(json.dumps(MANIFEST))
    assert load_manifest(j).safety_class is SafetyClass.HIGH
    m = load_manifest(FIXTURES / "tools" / "git-helper.sbpolicy", home="/h")
    assert m.name == "git-helper"
    assert m.profile == "workspace-write"
    assert m.permissions[1] == FsCapability(
        kind="fs.read", paths=("/workspace/**", "/h/.gitconfig"))


def test_validation_error_names_the_field_and_its_position(tmp_path: Path) -> None:
    bad = dict(GRANT, capabilities=[{"kind": "fs.read", "paths": []}, {"kind": "net.http"}])
    p = tmp_path / "g.json"
    p.write_text(json.dumps(bad, indent=2))
    errs = _errors(load_grant, p)
    assert errs[0][:3] == ("SBP105", 10, 7)
    assert "`capabilities[0].paths`" in errs[0][3]
    assert "`capabilities[1].hosts`" in errs[1][3]
    assert errs[1][1] == 12


def test_yaml_validation_error_position(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text("name: git\nversion: '1'\nsafety_class: Extreme\n")
    (err,) = _errors(load_manifest, p)
    assert err[:3] == ("SBP105", 3, 1)
    assert "`safety_class`" in err[3]


@pytest.mark.parametrize(("name", "text", "line", "column", "needle"), [
    ("g.json", '{"tenant": "a",\n  "x": }', 2, 8, "invalid JSON"),
    ("g.json", "", 1, 1, "invalid JSON"),
    ("g.yaml", "tenant: a\n  bad: [\n", 2, 6, "invalid YAML"),
    ("g.yaml", "- 1\n- 2\n", 1, 1, "mapping"),
    ("g.json", '{"tenant": "a", "unknown": 1}', 1, 2, "field"),
])
def test_malformed_documents(tmp_path: Path, name: str, text: str, line: int, column: int,
                             needle: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    errs = _errors(load_grant, p)
    assert errs[0][0] == "SBP105"
    assert needle in errs[0][3]
    if needle != "field":
        assert errs[0][1:3] == (line, column)


def test_unreadable_document(tmp_path: Path) -> None:
    assert _errors(load_grant, tmp_path / "missing.json")[0][0] == "SBP100"
    p = tmp_path / "latin.yaml"
    p.write_bytes(b"tenant: caf\xe9\n")
    assert _errors(load_grant, p)[0][0] == "SBP100"


def test_sbpolicy_manifest_errors(tmp_path: Path) -> None:
    p = tmp_path / "t.sbpolicy"
    p.write_text('tool "a" version "1" { safety Low }\ntool "b" version "1" { safety Low }\n')
    assert "found `a`, `b`" in _errors(load_manifest, p)[0][3]
    p.write_text('tool "a" version "1" { permit fs.read paths ["rel"] }\n')
    assert _errors(load_manifest, p)[0][:3] == ("SBP206", 1, 46)
    p.write_text('tool "a" version "1" {\n')
    assert _errors(load_manifest, p)[0][0] == "SBP103"


def test_load_document_positions(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("op:\n  kind: fs.read\n  paths:\n    - /a\n    - /b\n")
    data, lookup = load_document(p)
    assert data["op"]["paths"] == ["/a", "/b"]
    assert isinstance(lookup, PositionLookup)
    assert (lookup.span(("op", "paths", 1)).line, lookup.span(("op", "paths", 1)).column) == (5, 7)
    assert lookup.span(("op", "nothing", 3)).line == 1  # falls back to the known prefix
    assert field_path(("capabilities", 0, "paths")) == "capabilities[0].paths"
