"""CEL inside `.sbpolicy` conditions for the editor: the variables' types and fields."""

from __future__ import annotations

import re

from policy_engine.dsl.cel import CONTEXT_VARIABLES
from policy_engine.dsl.cel_schema import Schema, schemas

_DOTTED = re.compile(r"\b([a-z_]+)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\.([A-Za-z_0-9]*)$")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHAT = {
    "request": "the operation being decided (its op kind's fields plus what the guard adds)",
    "grant": "the Grant the call runs under",
    "manifest": "the tool's Manifest",
    "profile": "the resolved profile view",
    "tenant": "attributes of the tenant the caller supplies (open map)",
    "subject": "attributes of the subject the caller supplies (open map)",
}


def in_condition(row: str, index: int) -> bool:
    """Whether character ``index`` of ``row`` is inside a backtick CEL condition (an odd
    number of backticks before it on the line)."""
    return row[:index].count("`") % 2 == 1


def _schema(variable: str, path: list[str]) -> Schema | None:
    schema = schemas().get(variable)
    for part in path:
        if schema is None:
            return None
        schema = schema.fields.get(part)
    return schema


def fields_before(row: str, index: int) -> tuple[list[str], bool] | None:
    """The fields that may follow the dotted CEL path ending at ``index`` (``grant.``,
    ``grant.budget.ma``) and whether the object is closed; ``None`` when the cursor is not
    after such a path."""
    match = _DOTTED.search(row[:index])
    if match is None or match.group(1) not in schemas():
        return None
    path = [p for p in match.group(2).split(".") if p]
    schema = _schema(match.group(1), path)
    if schema is None:
        return None
    return sorted(schema.fields), schema.closed


def variables() -> tuple[str, ...]:
    """What a condition can name."""
    return CONTEXT_VARIABLES


def hover(row: str, index: int) -> str | None:
    """Markdown for the CEL context variable (or ``variable.field``) under ``index``."""
    if not in_condition(row, index):
        return None
    for match in _WORD.finditer(row):
        if match.start() <= index < match.end():
            break
    else:
        return None
    # the whole dotted path up to the word under the cursor
    head = re.search(r"([a-z_]+(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$", row[:match.end()])
    parts = head.group(1).split(".") if head else [match.group()]
    variable, path = parts[0], parts[1:]
    if variable == "now" and not path:
        return "`now`: `timestamp`, the injected clock"
    if variable not in schemas():
        return None
    schema = _schema(variable, path)
    shown = ".".join(parts)
    if not path:
        kind = "`map(string, dyn)`"
        head_line = f"`{shown}`: {kind}, {_WHAT[variable]}"
    else:
        head_line = f"`{shown}`: a field of `{'.'.join(parts[:-1])}`"
    if schema is None or not schema.fields:
        return head_line
    listed = ", ".join(f"`{f}`" for f in sorted(schema.fields))
    more = "" if schema.closed else " (and any other key)"
    return f"{head_line}\n\nfields: {listed}{more}"
