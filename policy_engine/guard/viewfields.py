"""Which top-level fields of the per-profile views a condition reads: the context holds those.

CEL converts every value of its activation on each evaluation, so a condition reading
``grant.subject_id`` paid for converting the whole ``grant`` view, capabilities included
(≈ 480 µs with a 1,001-capability grant). A variable is reachable only by its name, so when
every occurrence of the name in the source is a plain field access (``grant.subject_id``, not
``grant["x"]``, ``grant.?x``, ``size(grant)`` or a macro such as ``grant.exists(...)``), the view
trimmed to those fields gives the same answer: a field the condition names is either copied as
it is or absent in both. Any other occurrence, even inside a string literal or a comment (the
scan does not parse), keeps the whole view: the scan may only ever be too cautious.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

_FIELD = re.compile(r"\s*\.\s*([A-Za-z_][A-Za-z0-9_]*+)")
_CALL = re.compile(r"\s*\(")
_VAR = {name: re.compile(rf"\b{name}\b") for name in
        ("profile", "grant", "manifest", "tenant", "subject")}
_WORD = {name: re.compile(rf"\b{name}\b") for name in
         ("request", "grant", "manifest", "profile", "tenant", "subject", "now")}

Fields = frozenset[str] | None
"""The top-level fields read, or ``None`` for the whole view."""


@lru_cache(maxsize=4096)
def view_fields(source: str) -> Mapping[str, Fields]:
    """Per view the condition's ``source`` names: the fields it reads, or ``None`` (all)."""
    out: dict[str, Fields] = {}
    for name, pattern in _VAR.items():
        fields: set[str] | None = set()
        for m in pattern.finditer(source):
            f = _FIELD.match(source, m.end())
            if f is None or _CALL.match(source, f.end()) is not None:
                fields = None
                break
            assert fields is not None  # INVARIANT: set until the break above
            fields.add(f.group(1))
        else:
            if not fields:
                continue  # the name does not occur
        out[name] = None if fields is None else frozenset(fields)
    return out


def named_variables(source: object, variables: frozenset[str]) -> frozenset[str]:
    """Those of ``variables`` that ``source`` names as a whole word (all of them when the
    source is not text or a name is not one this module knows)."""
    if not isinstance(source, str) or not variables <= _WORD.keys():
        return variables
    return frozenset(v for v in variables if _WORD[v].search(source) is not None)


def trim_views(views: dict[str, object], sources: Iterable[str]) -> dict[str, object]:
    """``views`` with each view cut down to the fields ``sources`` read (whole where any reads
    it as a whole); a view no source names is kept as it is."""
    wanted: dict[str, Fields] = {}
    for source in sources:
        for name, fields in view_fields(source).items():
            if name in wanted:
                have = wanted[name]
                wanted[name] = None if have is None or fields is None else have | fields
            else:
                wanted[name] = fields
    out = dict(views)
    for name, fields in wanted.items():
        view = views.get(name)
        if fields is not None and isinstance(view, dict):
            out[name] = {k: v for k, v in view.items() if k in fields}
    return out
