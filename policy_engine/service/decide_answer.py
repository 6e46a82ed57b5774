"""`POST /v1/decide`'s answer: compact by default, the whole explain document on request.

The compact answer is what a caller acts on: the decision, its code, status and reason, the rule
that decided, the effective limits (each with the layer that set it) and the envelope the call's
evidence would name (policy name, version and hash, tool, ``profile_hash``, what the backend must
provide). It is decided without the tracer, as the run decides (``explain(trace=False)``); the
full document (``?explain=full``: the trace, the profile, ``refused_by``, the redacted op) is
the `explain --format json` contract and costs ≈ 5 KB and a traced decision per call
(docs/service.md, "Decide"). Both views carry the same decision, code, reason, rule and limits.
"""

from __future__ import annotations

from typing import Any, Literal

from policy_engine.explain.pipeline import Explanation
from policy_engine.model import LIMIT_FIELDS

View = Literal["compact", "full"]
VIEWS: tuple[View, ...] = ("compact", "full")

_QUERIES: dict[bytes, View] = {b"": "compact", b"explain=compact": "compact",
                               b"explain=full": "full"}


def view_of_query(query: bytes) -> View | None:
    """The view an exact query string asks for; ``None`` for any other query (the route's own
    parameter validation answers it)."""
    return _QUERIES.get(query)


def answer(result: Explanation, view: View) -> dict[str, Any]:
    """The answer document of ``result`` in ``view``."""
    if view == "full":
        return result.to_json()
    d = result.decision
    rule = d.rule
    policyset, manifest = result.policyset, result.manifest
    # built field by field: pydantic's model_dump costs more than the decision (≈ 2 µs each)
    return {
        "decision": d.decision,
        "code": d.code,
        "http_status": d.http_status,
        "reason": d.reason,
        "rule": None if rule is None else {"id": rule.id, "file": rule.file,
                                           "line": rule.line, "column": rule.column},
        "limits": _limits(result),
        "profile_hash": result.profile.profile_hash if result.profile is not None else None,
        "backend_requires": result.backend_requires(),
        "policy": {"name": policyset.name, "version": policyset.version,
                   "version_hash": policyset.version_hash},
        "tool": {"name": manifest.name, "version": manifest.version},
    }


# the rendered limits of a (limits, layers) pair: the guard answers a cached decision with the
# same two objects call after call, so the 13-field document is built once for them; keyed by
# their ids, each entry keeps both objects, so an id another object reuses never matches
_RENDERED: dict[tuple[int, int], tuple[object, object, dict[str, Any]]] = {}
_RENDERED_MAX = 1024


def _limits(result: Explanation) -> dict[str, Any]:
    """``result.limits()`` as the answer shows it (each value with the layer that set it); the
    answer is encoded at once and never changed, so the document may be shared."""
    d, profile = result.decision, result.profile
    if d.limits is not None:
        values, layers = d.limits, d.limit_layers
    elif profile is not None:
        values, layers = profile.limits, profile.limit_layers
    else:
        return {}
    key = (id(values), id(layers))
    hit = _RENDERED.get(key)
    if hit is not None and hit[0] is values and hit[1] is layers:
        return hit[2]
    shown = layers or {}
    rendered = {f: {"value": getattr(values, f), "layer": shown.get(f, "profile")}
                for f in LIMIT_FIELDS}
    if len(_RENDERED) >= _RENDERED_MAX:
        _RENDERED.clear()
    _RENDERED[key] = (values, layers, rendered)
    return rendered
