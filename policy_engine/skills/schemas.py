"""The JSON Schema validator of skill inputs: Draft 2020-12 with `pattern` run on RE2.

Inputs come from the agent and the patterns from the skill's author: with Python's backtracking
`re`, a pattern such as ``^(a+)+$`` spends seconds to hours on a few dozen characters, inside
the server, before any op exists. RE2 matches in linear time (the policy regexes use it too).
Schema features that would reach a backtracking engine or the network anyway
(``patternProperties``, a ``$ref`` that is not local) are refused when the skill is checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from policy_engine.patterns.regex import RegexError, compile_policy_regex


def _pattern(validator: Validator, pattern: str, instance: Any,
             schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        matched = compile_policy_regex(pattern).search(instance)
    except RegexError:
        matched = False  # never accepted by `skills check`; fail closed if it gets here
    if not matched:
        yield ValidationError(f"does not match the pattern {pattern!r}")


# jsonschema's stubs leave `extend` untyped; the class it returns is a Draft 2020-12 validator
InputValidator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"pattern": _pattern})


def input_validator(schema: dict[str, Any]) -> Validator:
    """A validator of ``schema`` whose ``pattern`` runs on RE2."""
    return InputValidator(schema)  # type: ignore[no-any-return]


def schema_problems(schema: Any, at: str) -> list[tuple[str, str]]:
    """(pointer, message) for every feature of a skill interface that is refused: a pattern
    RE2 cannot run, ``patternProperties``, a ``$ref`` that leaves the document."""
    found: list[tuple[str, str]] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            where = f"{at}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if key == "pattern" and isinstance(value, str):
                try:
                    compile_policy_regex(value)
                except RegexError as exc:
                    found.append((where, f"pattern {value!r} cannot run on RE2: {exc}"))
            elif key == "patternProperties" and isinstance(value, dict):
                found.append((where, "`patternProperties` is not supported in skill "
                               "interfaces (name the properties)"))
            elif key in ("$ref", "$dynamicRef") and isinstance(value, str) \
                    and not value.startswith("#"):
                found.append((where, f"`{key}` must point inside the manifest (`#/...`); "
                               "nothing is fetched"))
            found += schema_problems(value, where)
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            found += schema_problems(item, f"{at}/{i}")
    return found
