"""The one adapter around cel-expr-python: compile and type-check `when` conditions, evaluate them.

Conditions are compiled once, when the policy compiles, against the declared context variables;
errors are mapped from positions inside the backtick string to positions in the policy file.
A runtime error (an error value or an exception from the library) never allows anything:
:meth:`CelCondition.evaluate` returns ``(False, message)``.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Mapping
from enum import Enum
from functools import lru_cache
from typing import Any

from cel_expr_python import cel
from pydantic import BaseModel

from policy_engine.dsl.cel_schema import unknown_fields
from policy_engine.errors import Diagnostic, Span

CONTEXT_VARIABLES: tuple[str, ...] = (
    "request", "grant", "manifest", "profile", "tenant", "subject", "now",
)
"""What a condition sees. All but ``now`` are maps from string keys to dynamic values (JSON-like:
the guard passes ``model_dump(mode="json")`` of the Grant, Manifest and Profile, the op as
``request``); ``now`` is a timestamp (a timezone-aware ``datetime`` or milliseconds since epoch)."""

_ERROR_RE = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*)$", re.MULTILINE)


@lru_cache(maxsize=1)
def cel_env() -> Any:
    """The shared CEL environment with the context variables declared (built once)."""
    t = cel.Type
    dyn_map = t.Map(t.STRING, t.DYN)
    variables = {name: dyn_map for name in CONTEXT_VARIABLES if name != "now"}
    variables["now"] = t.TIMESTAMP
    return cel.NewEnv(variables=variables)


class CelCondition:
    """A compiled, type-checked condition (implements ``graph.CompiledCondition``).

    :attr variables: the context variables the source can read: every declared name that
        occurs in the text (a superset: CEL reaches a variable only by naming it), so a caller
        may build just these.
    """

    __slots__ = ("_eval", "_expr", "source", "span", "variables")

    def __init__(self, source: str, span: Span, expr: Any) -> None:
        self.source = source
        self.span = span
        self._expr = expr
        self._eval = expr.eval
        self.variables = frozenset(v for v in CONTEXT_VARIABLES if v in source)

    def __repr__(self) -> str:
        return f"CelCondition({self.source!r} at {self.span})"

    def result_type(self) -> Any:
        """The static CEL type the checker inferred for this condition."""
        return self._expr.return_type()

    def evaluate(self, context: Mapping[str, object]) -> tuple[bool, str | None]:
        """Evaluate against ``context``; any error yields ``(False, message)``, never an allow."""
        try:
            data = activation(context)
        except Exception as exc:  # noqa: BLE001 - an unconvertible context must deny, not raise
            return False, f"condition error: {_strip_status(str(exc))}"
        return self.evaluate_plain(data)

    def evaluate_plain(self, data: Mapping[str, object]) -> tuple[bool, str | None]:
        """:meth:`evaluate` for a context already in :func:`activation` form (plain JSON-like
        values, ``now`` a timezone-aware ``datetime``): no conversion pass. The guard builds
        its context that way once per decision."""
        try:
            value = self._eval(data=data, arena=_arena())
            plain = value.plain_value()
            # INVARIANT: only a CEL bool has a Python bool as its plain value (errors are
            # strings, wrappers unwrap to their primitive), so this is the type check, cheaper
            if plain is True or plain is False:
                return plain, None
            vtype = value.type()
            if vtype == _ERROR:
                return False, f"condition error: {_strip_status(str(plain))}"
            return False, f"condition evaluated to `{vtype.name().lower()}`, not `bool`"
        # The library raises RuntimeError/TypeError/ValueError for unconvertible inputs; whatever
        # it raises, a condition that cannot be evaluated must deny, so catch everything here.
        except Exception as exc:  # noqa: BLE001 - reason above: an error must never allow
            return False, f"condition error: {_strip_status(str(exc))}"


_ERROR = cel.Type.ERROR
_LOCAL = threading.local()
_ARENA_USES = 512


def _arena() -> Any:
    """This thread's evaluation arena, replaced every ``_ARENA_USES`` evaluations.

    An arena per evaluation (the library's default) costs ≈ 0.4 µs of a ≈ 3 µs evaluation; one
    arena kept forever grows by every evaluation's values (≈ 180 bytes each). Values are read
    (``plain_value``) before the thread evaluates again, so replacing it then is safe; per thread,
    so no arena is ever shared by two evaluations at once.
    """
    local = _LOCAL
    left: int = getattr(local, "left", 0)
    if left <= 0:
        local.arena = cel.Arena()
        left = _ARENA_USES
    local.left = left - 1
    return local.arena


def activation(context: Mapping[str, object]) -> dict[str, Any]:
    """Convert ``context`` to plain CEL values (models dumped, tuples to lists, ms to time)."""
    out: dict[str, Any] = {}
    for key, value in context.items():
        if key == "now" and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
        else:
            out[key] = to_cel_value(value)
    return out


_SCALARS = (str, int, float, bool, type(None), dt.datetime)


def to_cel_value(value: object) -> Any:
    """A plain JSON-like value CEL accepts: pydantic models, enums, tuples and sets converted.

    Plain values are checked by exact type first (``isinstance`` against the ``Mapping`` ABC is
    slow), and a dict or list that holds only plain values is returned as it is, not copied.
    """
    tp = type(value)
    if tp in _SCALARS:
        return value
    if tp is dict:
        d: dict[Any, Any] = value  # type: ignore[assignment]  # narrowed by the exact type check
        conv = {str(k): to_cel_value(v) for k, v in d.items()}
        return d if _same(d.values(), conv.values()) and all(type(k) is str for k in d) else conv
    if tp is list:
        lst: list[Any] = value  # type: ignore[assignment]  # narrowed by the exact type check
        items = [to_cel_value(v) for v in lst]
        return lst if _same(lst, items) else items
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): to_cel_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_cel_value(v) for v in value]
    return value


def _same(before: Any, after: Any) -> bool:
    return all(a is b for a, b in zip(before, after, strict=True))


def compile_condition(source: str, span: Span) -> CelCondition | list[Diagnostic]:
    """Compile ``source`` written at ``span`` (the opening backtick) against the context.

    Compilation includes the library's type check (undeclared names, no matching overload).
    :returns: the condition, or SBP209 (syntax) / SBP210 (type) diagnostics positioned in the
        policy file. Whether the result is boolean is :func:`check_boolean`'s job.
    """
    if not source.strip():
        return [Diagnostic.make("SBP209", "empty CEL condition", span)]
    try:
        expr = cel_env().compile(source)
    except Exception as exc:  # noqa: BLE001 - the library raises RuntimeError; map any failure
        return _compile_errors(str(exc), span)
    return CelCondition(source, span, expr)


def check_fields(condition: CelCondition) -> list[Diagnostic]:
    """SBP210 for every field the condition names that the context's closed schemas do not
    have (``grant.subjectid``): the library sees ``map(string, dyn)`` and cannot tell."""
    source, span = condition.source, condition.span
    return [Diagnostic.make("SBP210", f"unknown field in CEL condition: {message}",
                            _offset_span(span, source, offset),
                            help="conditions read the closed schemas of request, grant, "
                                 "manifest and profile; see docs/language.md")
            for offset, message in unknown_fields(source)]


def _offset_span(span: Span, source: str, offset: int) -> Span:
    line = source.count("\n", 0, offset) + 1
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return cel_span(span, line, column)


def check_boolean(condition: CelCondition) -> Diagnostic | None:
    """SBP211 unless the condition's static type is ``bool`` (or ``dyn``, checked when run)."""
    rtype = condition.result_type()
    if rtype == cel.Type.BOOL or rtype == cel.Type.DYN:
        return None
    return Diagnostic.make(
        "SBP211",
        f"condition has type `{rtype.name().lower()}`, a `when` condition must be `bool`",
        cel_span(condition.span, 1, 1),
    )


def cel_span(span: Span, line: int, column: int) -> Span:
    """Map a 1-based (line, column) inside the CEL text to the policy file.

    INVARIANT: ``span`` is the position of the opening backtick, so the text's first character
    is one column to its right; later lines start at column 1 of the file.
    """
    if line <= 1:
        return Span(span.file, span.line, span.column + column)
    return Span(span.file, span.line + line - 1, column)


def _compile_errors(text: str, span: Span) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for m in _ERROR_RE.finditer(text):
        line, column = int(m.group(1)), int(m.group(2))
        message = re.sub(r"'([^'\n]*)'", r"`\1`", _strip_status(m.group(3)))
        message = message.replace(" (in container ``)", "")
        if message.startswith("Syntax error:"):
            detail = message.removeprefix("Syntax error:").strip()
            out.append(Diagnostic.make(
                "SBP209", f"syntax error in CEL condition: {detail}", cel_span(span, line, column),
            ))
        else:
            out.append(Diagnostic.make(
                "SBP210", f"type error in CEL condition: {message}", cel_span(span, line, column),
            ))
    if not out:
        out.append(Diagnostic.make("SBP209", f"invalid CEL condition: {_strip_status(text)}",
                                   cel_span(span, 1, 1)))
    return out


def _strip_status(text: str) -> str:
    """Drop the absl status prefix/suffix (``INVALID_ARGUMENT: ... [INVALID_ARGUMENT]``)."""
    text = re.sub(r"^[A-Z_]+: ", "", text.strip())
    return re.sub(r"\s*\[[A-Z_]+\]$", "", text)
