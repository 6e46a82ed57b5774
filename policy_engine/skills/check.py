"""`policy-engine skills check`: every skills/<id>/manifest.json against the schema and its
directory, with file:line:col diagnostics; the loader the service and the MCP server use."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from policy_engine.errors import Diagnostic, DiagnosticsError, Span
from policy_engine.skills.jsonpos import JsonSyntaxError, Located, escape, parse
from policy_engine.skills.model import OP_FIELDS, Skill, placeholder
from policy_engine.skills.refs import ref_problems
from policy_engine.skills.schemas import schema_problems

SCHEMA_DIR = "_schema"


@cache
def manifest_schema() -> dict[str, Any]:
    """The skill manifest schema shipped with the engine (skills/_schema/ holds a copy)."""
    text = resources.files("policy_engine.skills").joinpath("manifest.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(manifest_schema())


def pointer_of(error: ValidationError) -> str:
    """The JSON pointer (RFC 6901) of the value an error is about."""
    return "".join(f"/{escape(str(p))}" for p in error.absolute_path)


def describe(error: ValidationError) -> str:
    """A short message naming the place: ``/runtime/kind: 'podman' is not one of [...]``."""
    where = pointer_of(error) or "/"
    if "/permissions/fs/" in where and error.validator in ("pattern", "not"):
        return (f"{where}: `{error.instance}` is not a path beneath inputs/, work/ or "
                "artifacts/ (relative, no `.` or `..` segments, `*` only in the last one)")
    if where == "/id" and error.validator == "pattern":
        return f"/id: `{error.instance}` is not a dotted lower-case id such as `shell.run`"
    return f"{where}: {error.message}"


def _diag(diag_id: str, message: str, path: Path, doc: Located | None,
          pointer: str = "") -> Diagnostic:
    line, col = doc.position(pointer) if doc is not None else (0, 0)
    return Diagnostic.make(diag_id, message, Span(str(path), line, col))


def _semantic(doc: Located, path: Path, dirname: str) -> list[Diagnostic]:
    """What the schema cannot say: the id is the directory, arguments name inputs, the
    interface schemas are schemas."""
    value = doc.value
    found: list[Diagnostic] = []
    if value["id"] != dirname:
        found.append(_diag("SBP432", f"id `{value['id']}` is in directory `{dirname}`", path,
                           doc, "/id"))
    for group in ("inputs", "outputs"):
        try:
            Draft202012Validator.check_schema(value["interface"][group])
        except SchemaError as exc:
            at = f"/interface/{group}" + "".join(f"/{escape(str(p))}" for p in exc.path)
            found.append(_diag("SBP435", f"{at}: {exc.message}", path, doc, at))
        for at, message in schema_problems(value["interface"][group], f"/interface/{group}"):
            found.append(_diag("SBP435", f"{at}: {message}", path, doc, at))
        for at, message in ref_problems(value["interface"][group], f"/interface/{group}"):
            found.append(_diag("SBP435", f"{at}: {message}", path, doc, at))
    if any(d.id == "SBP435" for d in found):
        # the checks below read the inputs schema's shape (`properties` an object, `required`
        # strings); an interface that is no schema has been reported, and is not read further
        return found
    inputs = value["interface"]["inputs"]
    props = inputs.get("properties", {}) if isinstance(inputs, dict) else {}
    strings = {k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"}
    runtime = value["runtime"]
    required = {r for r in inputs.get("required", []) if isinstance(r, str)} \
        if isinstance(inputs, dict) else set()
    for i, arg in enumerate(runtime.get("args", [])):
        name = placeholder(arg)
        if name is not None and name not in strings:
            found.append(_diag("SBP433", f"argument `{arg}` names no string input", path, doc,
                               f"/runtime/args/{i}"))
        elif name is not None and name not in required:
            found.append(_diag("SBP433", f"argument `{arg}` names input `{name}`, which "
                               "`interface.inputs.required` does not list", path, doc,
                               f"/runtime/args/{i}"))
    allowed = OP_FIELDS.get(runtime["kind"], ())
    for field, name in runtime.get("op", {}).items():
        at = f"/runtime/op/{escape(field)}"
        if field not in allowed:
            found.append(_diag("SBP433", f"`{field}` is not an op field of a "
                               f"{runtime['kind']} runtime (one of {', '.join(allowed)})",
                               path, doc, at))
        elif name not in props:
            found.append(_diag("SBP433", f"op field `{field}` takes input `{name}`, which "
                               "`interface.inputs` does not declare", path, doc, at))
    for field in ("url", "path"):
        name = runtime.get("op", {}).get(field)
        if name is not None and name in props and name not in required:
            found.append(_diag("SBP433", f"op field `{field}` takes input `{name}`, which "
                               "`interface.inputs.required` does not list", path, doc,
                               f"/runtime/op/{field}"))
    if runtime["kind"] in ("http", "browser") and "url" not in runtime.get("op", {}):
        found.append(_diag("SBP433", "an http or browser runtime needs `op.url`", path, doc,
                           "/runtime/op"))
    if runtime["kind"] == "fs" and "path" not in runtime.get("op", {}):
        found.append(_diag("SBP433", "an fs runtime needs `op.path`", path, doc, "/runtime/op"))
    return found


def check_manifest(path: Path, dirname: str) -> tuple[Skill | None, list[Diagnostic]]:
    """One manifest: the skill when it is clean, and every diagnostic found."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [_diag("SBP430", f"cannot read: {exc}", path, None)]
    try:
        doc = parse(text)
    except JsonSyntaxError as err:
        return None, [Diagnostic.make("SBP430", err.message, Span(str(path), err.line,
                                                                  err.column))]
    errors = list(_validator().iter_errors(doc.value))
    if errors:
        found = [_diag("SBP431", describe(e), path, doc, pointer_of(e)) for e in errors]
        return None, sorted(found, key=lambda d: (d.span.line, d.span.column) if d.span
                            else (0, 0))
    found = _limits(doc, path) + _semantic(doc, path, dirname)
    return (None if found else Skill(doc.value, path)), found


_MAX_LIMIT = 2**63 - 1  # what every consumer of a limit stores (SQLite, PostgreSQL BIGINT, C)
_MAX_CORES = 4096.0


def _limits(doc: Located, path: Path) -> list[Diagnostic]:
    """What the schema's ``integer`` lets through but no call can use: ``1e308`` (JSON Schema
    counts a float without a fraction as an integer), values past 2^63-1, and whatever else
    the engine's limits model refuses; each would have been a 500 on every invoke."""
    from pydantic import ValidationError as ModelError

    from policy_engine.model import Limits

    limits = doc.value.get("limits", {})
    found: list[Diagnostic] = []
    for key, value in limits.items():
        at = f"/limits/{escape(key)}"
        if key == "cpu_cores":
            if isinstance(value, int | float) and value > _MAX_CORES:
                found.append(_diag("SBP431", f"{at}: {value!r} is over {_MAX_CORES:g} cores",
                                   path, doc, at))
        elif isinstance(value, float):
            found.append(_diag("SBP431", f"{at}: {value!r} is not written as an integer "
                               "(digits only, no exponent or fraction)", path, doc, at))
        elif isinstance(value, int) and value > _MAX_LIMIT:
            found.append(_diag("SBP431", f"{at}: {value} is over 2^63-1", path, doc, at))
    if found:
        return found
    try:
        Limits.model_validate(limits)
    except ModelError as exc:
        for err in exc.errors():
            at = "/limits" + "".join(f"/{escape(str(p))}" for p in err["loc"])
            found.append(_diag("SBP431", f"{at}: {err['msg']}", path, doc, at))
    return found


def check_dir(root: Path) -> tuple[list[Skill], list[Diagnostic]]:
    """Every ``<root>/<id>/manifest.json`` (``_schema`` skipped), sorted by id."""
    if not root.is_dir():
        return [], [Diagnostic.make("SBP434", f"`{root}` is not a directory", Span(str(root),
                                                                                    0, 0))]
    skills: list[Skill] = []
    diags: list[Diagnostic] = []
    dirs = sorted(d for d in root.iterdir() if d.is_dir() and d.name != SCHEMA_DIR)
    for sub in dirs:
        manifest = sub / "manifest.json"
        if not manifest.is_file():
            diags.append(Diagnostic.make("SBP434", f"`{sub.name}/` has no manifest.json",
                                         Span(str(sub), 0, 0)))
            continue
        skill, found = check_manifest(manifest, sub.name)
        diags += found
        if skill is not None:
            skills.append(skill)
    if not dirs:
        diags.append(Diagnostic.make("SBP434", f"`{root}` has no skill directories",
                                     Span(str(root), 0, 0)))
    return skills, diags


def load_skills(root: Path) -> dict[str, Skill]:
    """The skills of ``root`` by id.

    :raises DiagnosticsError: when any manifest has a problem (nothing half-loaded is served).
    """
    skills, diags = check_dir(root)
    if diags:
        raise DiagnosticsError(diags)
    return {s.id: s for s in skills}
