"""The add-only public surface (seed 000 §13): error codes, enum members, evidence field types.

``surface()`` extracts it from the code; ``compare(baseline, current)`` says what was removed,
renamed or retyped (a break) and what was added (fine, to be recorded in the baseline with
``python3 conformance/compat/update_baseline.py``, which only ever adds).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing
from enum import Enum
from typing import Any

from pydantic import BaseModel

from policy_engine import errors
from policy_engine.model import EvidenceBegin, EvidenceEnd

Surface = dict[str, dict[str, Any]]
_ENUM_MODULES = ("policy_engine.errors",)


def _model_modules() -> list[Any]:
    import policy_engine.model as model

    names = [f"policy_engine.model.{m.name}" for m in pkgutil.iter_modules(model.__path__)]
    return [importlib.import_module(n) for n in sorted(names)]


def _enums() -> dict[str, Any]:
    out: dict[str, Any] = {}
    modules = [importlib.import_module(m) for m in _ENUM_MODULES] + _model_modules()
    for module in modules:
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, Enum) and obj.__module__ == \
                    module.__name__ and obj is not errors.ErrorCode:
                out[f"{name}"] = {m.name: m.value for m in obj}
            elif inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == \
                    module.__name__:
                for field, info in obj.model_fields.items():
                    values = _literal_values(info.annotation)
                    if values:
                        out[f"{name}.{field}"] = {str(v): v for v in values}
    return dict(sorted(out.items()))


def _literal_values(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    values: list[Any] = []
    for arg in typing.get_args(annotation):
        values.extend(_literal_values(arg))
    return values


def _type_of(schema: dict[str, Any], defs: dict[str, Any], path: str,
             out: dict[str, str]) -> str:
    """A stable type string for ``schema``; nested objects also add their own paths."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        target = defs[name]
        if "properties" in target:
            _object_fields(target, defs, path, out)
            return f"object:{name}"
        return _type_of(target, defs, path, out)
    if "anyOf" in schema:
        return "|".join(sorted(_type_of(s, defs, path, out) for s in schema["anyOf"]))
    kind = schema.get("type", "any")
    if kind == "array":
        items = schema.get("items") or (schema.get("prefixItems") or [{}])[0]
        return f"array<{_type_of(items, defs, path + '[]', out)}>"
    if kind == "object" and "properties" in schema:
        _object_fields(schema, defs, path, out)
    if "enum" in schema or "const" in schema:
        return f"{kind}:enum"
    return str(kind)


def _object_fields(schema: dict[str, Any], defs: dict[str, Any], prefix: str,
                   out: dict[str, str]) -> None:
    for name, prop in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out[path] = _type_of(prop, defs, path, out)


def _evidence_fields() -> dict[str, str]:
    out: dict[str, str] = {}
    for label, model in (("EvidenceBegin", EvidenceBegin), ("EvidenceEnd", EvidenceEnd)):
        schema = model.model_json_schema()
        _object_fields(schema, schema.get("$defs", {}), label, out)
    return dict(sorted(out.items()))


def surface() -> Surface:
    """The current public surface, in the baseline's shape."""
    return {
        "error_codes": {c.name: c.value for c in errors.ErrorCode},
        "enums": _enums(),
        "evidence_fields": _evidence_fields(),
    }


def compare(baseline: Surface, current: Surface) -> tuple[list[str], list[str]]:
    """``(breaks, additions)``: each a human-readable line naming the item."""
    breaks: list[str] = []
    added: list[str] = []
    for name, value in baseline.get("error_codes", {}).items():
        now = current["error_codes"].get(name)
        if now is None:
            renamed = [n for n, v in current["error_codes"].items() if v == value]
            how = f" (renamed to ErrorCode.{renamed[0]}?)" if renamed else ""
            breaks.append(f"error code ErrorCode.{name} = {value!r} was removed{how}")
        elif now != value:
            breaks.append(f"error code ErrorCode.{name} changed value {value!r} -> {now!r}")
    added += [f"error code ErrorCode.{n} = {v!r}" for n, v in current["error_codes"].items()
              if n not in baseline.get("error_codes", {})]
    for enum, members in baseline.get("enums", {}).items():
        now_members = current["enums"].get(enum)
        if now_members is None:
            breaks.append(f"enum {enum} was removed")
            continue
        for member, value in members.items():
            if member not in now_members:
                breaks.append(f"enum member {enum}.{member} = {value!r} was removed or renamed")
            elif now_members[member] != value:
                breaks.append(f"enum member {enum}.{member} changed value {value!r} -> "
                              f"{now_members[member]!r}")
    for enum, members in current["enums"].items():
        old = baseline.get("enums", {}).get(enum, {})
        added += [f"enum member {enum}.{m} = {v!r}" for m, v in members.items() if m not in old]
    for field, kind in baseline.get("evidence_fields", {}).items():
        now = current["evidence_fields"].get(field)
        if now is None:
            breaks.append(f"evidence field {field} ({kind}) was removed or renamed")
        elif now != kind:
            breaks.append(f"evidence field {field} changed type {kind} -> {now}")
    added += [f"evidence field {f} ({k})" for f, k in current["evidence_fields"].items()
              if f not in baseline.get("evidence_fields", {})]
    return breaks, added


def merge(baseline: Surface, current: Surface) -> Surface:
    """``baseline`` plus whatever ``current`` adds; nothing in the baseline is dropped."""
    out: Surface = {k: dict(v) for k, v in baseline.items()}
    for section in ("error_codes", "evidence_fields"):
        for key, value in current[section].items():
            out.setdefault(section, {}).setdefault(key, value)
    for enum, members in current["enums"].items():
        target = out.setdefault("enums", {}).setdefault(enum, {})
        for member, value in members.items():
            target.setdefault(member, value)
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}
