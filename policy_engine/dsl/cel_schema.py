"""The closed schemas a CEL condition reads, and the check that every field it names exists.

The CEL environment declares the context variables as ``map(string, dyn)``, so the library's
type check cannot see a typo in a field: ``grant.subjectid`` would compile and then be an error
at run time (a condition that is never true). This module walks the member chains of the
source (``grant.budget.calls``, ``request["path"]``) and checks each against the schema of what
the guard passes: the ``Grant``, ``Manifest`` and op models, and the ``profile`` view.

``tenant`` and ``subject`` are attribute maps the caller supplies (``tenant.tier``): open,
except that a field one edit away from a known one (``subject.idd``) is taken for a typo.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass, field
from functools import lru_cache

from pydantic import BaseModel

from policy_engine.model import (
    BrowserNavOp,
    BrowserScreenshotOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetHttpOp,
    ProcExecOp,
    TmpAllocOp,
)


@dataclass(frozen=True, slots=True)
class Schema:
    """The fields of one object; ``closed`` means any other field is an error."""

    fields: dict[str, Schema | None] = field(default_factory=dict)  # None: not checked below
    closed: bool = True


_REQUEST_EXTRA = ("kind", "path", "size", "scheme", "host", "port", "query", "method", "tool",
                  "args")
"""What the guard adds to the op's own fields in ``request`` (``guard.resolve._request``)."""
_PROFILE_VIEW = ("name", "safety", "side_effects", "network", "tool_name", "tenant",
                 "subject_id")
"""The ``profile`` view (``guard.compiled.static_views``)."""
_GRANT_VIEW = ("tenant", "subject_id", "tool_name", "call_id", "expires_at", "budget",
               "capabilities", "consent")
"""The ``grant`` view the guard builds from the profile (``guard.compiled.static_views``): the
grant's fields a profile carries (not its ``limits``, met into the profile's, nor the
``decision_key_fingerprint``)."""
_MANIFEST_VIEW = ("name", "version", "side_effects", "safety_class", "permissions")
"""The ``manifest`` view likewise (not its ``description`` nor its ``limits``)."""


def _view_schema(model: type[BaseModel], names: tuple[str, ...]) -> Schema:
    whole = _model_schema(model)
    return Schema({name: whole.fields[name] for name in names})


def _model_schema(model: type[BaseModel]) -> Schema:
    fields: dict[str, Schema | None] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        fields[key] = _nested(info.annotation)
    return Schema(fields)


def _nested(annotation: object) -> Schema | None:
    """A closed schema for a model-typed field (``Budget``, ``Consent | None``), else None."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    return _model_schema(models[0]) if len(models) == 1 else None


@lru_cache(maxsize=1)
def schemas() -> dict[str, Schema]:
    """The schema of each context variable but ``now`` (a timestamp)."""
    request: dict[str, Schema | None] = {k: None for k in _REQUEST_EXTRA}
    for op in (FsReadOp, FsWriteOp, FsListOp, NetHttpOp, BrowserNavOp, BrowserScreenshotOp,
               ProcExecOp, TmpAllocOp):
        request.update({k: None for k in op.model_fields})
    attributes = Schema({"id": None}, closed=False)
    return {
        "request": Schema(request),
        "grant": _view_schema(Grant, _GRANT_VIEW),
        "manifest": _view_schema(Manifest, _MANIFEST_VIEW),
        "profile": Schema({k: None for k in _PROFILE_VIEW}),
        "tenant": attributes,
        "subject": attributes,
    }


# ---- scanning the source ------------------------------------------------------------------

_TOKEN = re.compile(r"""
  (?P<str>[rRbB]{0,2}(?:'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\"
                        |'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
| (?P<comment>//[^\n]*)
| (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
| (?P<dot>\.)
| (?P<index>\[\s*(?P<key>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")\s*\])
| (?P<ws>\s+)
| (?P<other>.)
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class FieldRef:
    """One field a chain names: ``var.a.b`` gives ``(var, ("a",), offset of a)`` and so on."""

    variable: str
    path: tuple[str, ...]
    offset: int  # in the source, of the field's name


def field_refs(source: str, variables: typing.Collection[str]) -> list[FieldRef]:
    """Every field access reached from a context variable, in source order.

    A name followed by ``(`` is a method call (``startsWith``, ``exists``): the chain ends
    before it. A variable after a ``.`` is a field of something else, not the variable.
    """
    toks = [(m.lastgroup or "", m.group(), m.start(), m.group("key"))
            for m in _TOKEN.finditer(source) if m.lastgroup not in ("ws", "comment")]
    out: list[FieldRef] = []
    i = 0
    while i < len(toks):
        kind, text, _, _ = toks[i]
        prev = toks[i - 1][0] if i else ""
        if kind != "ident" or text not in variables or prev == "dot":
            i += 1
            continue
        path: list[str] = []
        j = i + 1
        while j < len(toks):
            if toks[j][0] == "dot" and j + 1 < len(toks) and toks[j + 1][0] == "ident":
                after = toks[j + 2][1] if j + 2 < len(toks) else ""
                if after == "(":
                    break
                path.append(toks[j + 1][1])
                out.append(FieldRef(text, tuple(path), toks[j + 1][2]))
                j += 2
            elif toks[j][0] == "index" and toks[j][3] is not None:
                path.append(_unquote(toks[j][3]))
                out.append(FieldRef(text, tuple(path), toks[j][2]))
                j += 1
            else:
                break
        i = j
    return out


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    return body.encode("utf-8").decode("unicode_escape") if "\\" in body else body


# ---- checking -------------------------------------------------------------------------------


def unknown_fields(source: str) -> list[tuple[int, str]]:
    """``(offset, message)`` for every field the schemas do not have."""
    table = schemas()
    out: list[tuple[int, str]] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for ref in field_refs(source, table):
        schema: Schema | None = table[ref.variable]
        for depth, name in enumerate(ref.path):
            if schema is None:
                break
            if name in schema.fields:
                schema = schema.fields[name]
                continue
            near = closest(name, schema.fields)
            where = ".".join((ref.variable, *ref.path[:depth]))
            # an open attribute map only flags a near miss of a known field (`subject.idd`)
            typo = near is not None and near[1] <= 2
            if (schema.closed or typo) and (ref.variable, ref.path[:depth + 1]) not in seen:
                seen.add((ref.variable, ref.path[:depth + 1]))
                known = sorted(schema.fields)
                hint = f"; did you mean `{near[0]}`?" if near is not None else \
                    f"; `{where}` has " + ", ".join(f"`{k}`" for k in known[:12]) + \
                    (", ..." if len(known) > 12 else "")
                out.append((ref.offset, f"`{where}` has no field `{name}`{hint}"))
            break
    return out


def closest(name: str, candidates: typing.Iterable[str]) -> tuple[str, int] | None:
    """The candidate nearest ``name`` and its score (0: the same but for case and ``_``, else
    one more than the edit distance), if reasonably near."""
    def norm(s: str) -> str:
        return s.lower().replace("_", "")

    best: tuple[int, str] | None = None
    for cand in sorted(candidates):
        a, b = norm(name), norm(cand)
        d = 0 if a == b else 2 if len(a) >= 3 and (b.startswith(a) or a.startswith(b)) \
            else distance(a, b) + 1
        if best is None or d < best[0]:
            best = (d, cand)
    if best is None or best[0] > max(2, len(name) // 3):
        return None
    return best[1], best[0]


def distance(a: str, b: str) -> int:
    """Levenshtein distance (names are short)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]
