"""`policy-engine schema`: print the JSON Schemas of the model (grants, manifests, ops, …)."""

from __future__ import annotations

import click

from policy_engine.cli.common import echo_json
from policy_engine.explain.request import ExplainRequest
from policy_engine.model.schemas import SCHEMA_TYPES, json_schema

# the model's types plus the request document that `explain` and `run` read
_TYPES = {**SCHEMA_TYPES, "request": ExplainRequest}


@click.command("schema")
@click.argument("names", nargs=-1, type=click.Choice(sorted(_TYPES)))
def command(names: tuple[str, ...]) -> None:
    """Print JSON Schemas; all of them (as one object keyed by name) unless NAMES are given."""
    chosen = names or tuple(sorted(_TYPES))
    if len(chosen) == 1:
        echo_json(json_schema(chosen[0], _TYPES))
    else:
        echo_json({name: json_schema(name, _TYPES) for name in chosen})
