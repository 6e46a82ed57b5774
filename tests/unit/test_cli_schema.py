"""`policy-engine schema`: every schema is valid JSON Schema and accepts the shipped examples."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from policy_engine.cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def schemas() -> dict[str, dict[str, object]]:
    result = CliRunner().invoke(cli, ["schema"])
    assert result.exit_code == 0, result.output
    out: dict[str, dict[str, object]] = json.loads(result.output)
    return out


def test_every_schema_is_a_valid_draft_2020_12_schema() -> None:
    all_schemas = schemas()
    assert {"grant", "manifest", "request", "exec-op", "profile", "evidence-end"} <= set(
        all_schemas)
    for schema in all_schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_examples_validate_against_their_schemas() -> None:
    s = schemas()
    for grant in (EXAMPLES / "grants").glob("*.json"):
        jsonschema.validate(json.loads(grant.read_text()), s["grant"])
    jsonschema.validate(json.loads((EXAMPLES / "manifests/shell.json").read_text()),
                        s["manifest"])
    jsonschema.validate(yaml.safe_load((EXAMPLES / "manifests/http-fetch.yaml").read_text()),
                        s["manifest"])
    for request in (EXAMPLES / "requests").glob("*.json"):
        jsonschema.validate(json.loads(request.read_text()), s["request"])


def test_an_op_without_its_kind_tag_is_rejected_by_the_schema() -> None:
    op_schema = schemas()["exec-op"]
    jsonschema.validate({"kind": "fs.read", "path": "/workspace/a"}, op_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"path": "/workspace/a"}, op_schema)


def test_unknown_schema_name_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["schema", "nope"])
    assert result.exit_code == 2
    assert "nope" in result.output
