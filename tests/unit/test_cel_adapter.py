"""The CEL adapter: compile-time checks, runtime errors deny, and agreement with cel-python."""

from __future__ import annotations

import datetime as dt
from typing import Any

import celpy
import pytest
from pydantic import BaseModel

from policy_engine.dsl.cel import (
    CONTEXT_VARIABLES,
    CelCondition,
    activation,
    cel_span,
    check_boolean,
    compile_condition,
    to_cel_value,
)
from policy_engine.errors import Span
from policy_engine.model import SafetyClass

AT = Span("p.sbpolicy", 7, 10)  # the opening backtick


def _compiled(source: str) -> CelCondition:
    result = compile_condition(source, AT)
    assert isinstance(result, CelCondition), result
    return result


def test_declared_variables_compile() -> None:
    assert set(CONTEXT_VARIABLES) == {"request", "grant", "manifest", "profile", "tenant",
                                      "subject", "now"}
    for name in CONTEXT_VARIABLES[:-1]:
        cond = _compiled(f'has({name}.x) || size({name}) == 0')
        assert check_boolean(cond) is None
    assert check_boolean(_compiled('now > timestamp("2020-01-01T00:00:00Z")')) is None


@pytest.mark.parametrize(("source", "code", "line", "column"), [
    ("1 +", "SBP209", 7, 14),
    ("undeclared == 1", "SBP210", 7, 11),
    ('1 + "a"', "SBP210", 7, 13),
    ("now + 1 > now", "SBP210", 7, 15),
    ("request.a &&\n   (1 + true)", "SBP210", 8, 7),
    ("", "SBP209", 7, 10),
])
def test_compile_errors_map_to_file_positions(
    source: str, code: str, line: int, column: int,
) -> None:
    result = compile_condition(source, AT)
    assert isinstance(result, list)
    assert result[0].id == code
    assert result[0].span is not None
    assert (result[0].span.line, result[0].span.column) == (line, column)


def test_every_type_error_is_reported() -> None:
    result = compile_condition('1 + "a" || 2 + "b"', AT)
    assert isinstance(result, list)
    assert [d.span.column for d in result if d.span] == [13, 24]


def test_non_boolean_result_is_sbp211() -> None:
    problem = check_boolean(_compiled("request.size + 1"))
    assert problem is not None
    assert problem.id == "SBP211"
    assert "`int`" in problem.message
    assert check_boolean(_compiled("request.flag")) is None  # dyn: checked when evaluated


def test_cel_span_mapping() -> None:
    assert cel_span(AT, 1, 1) == Span("p.sbpolicy", 7, 11)
    assert cel_span(AT, 3, 4) == Span("p.sbpolicy", 9, 4)


def test_runtime_errors_never_allow() -> None:
    missing = _compiled("request.size > 3")
    ok, why = missing.evaluate({"request": {}})
    assert ok is False
    assert why is not None
    assert "size" in why
    div = _compiled("request.n / 0 == 1")
    assert div.evaluate({"request": {"n": 1}}) == (False, "condition error: divide by zero")
    weird = _compiled("request.n == 1")
    ok, why = weird.evaluate({"request": {"n": object()}})
    assert ok is False
    assert why is not None
    assert why.startswith("condition error")
    dyn = _compiled("request.flag")
    ok, why = dyn.evaluate({"request": {"flag": "yes"}})
    assert ok is False
    assert why == "condition evaluated to `string`, not `bool`"
    assert dyn.evaluate({"request": {"flag": True}}) == (True, None)


class _Req(BaseModel):
    size: int
    safety: SafetyClass
    tags: tuple[str, ...]


def test_activation_converts_models_tuples_enums_and_ms() -> None:
    data = activation({"request": _Req(size=3, safety=SafetyClass.HIGH, tags=("a",)),
                       "profile": {"side_effects": ("Write",)}, "now": 86_400_000})
    assert data["request"] == {"size": 3, "safety": "High", "tags": ["a"]}
    assert data["profile"] == {"side_effects": ["Write"]}
    assert data["now"] == dt.datetime(1970, 1, 2, tzinfo=dt.UTC)
    cond = _compiled('request.safety == "High" && "a" in request.tags && '
                     'now > timestamp("1970-01-01T00:00:00Z")')
    assert cond.evaluate({"request": _Req(size=3, safety=SafetyClass.HIGH, tags=("a",)),
                          "now": 86_400_000}) == (True, None)


# ---- cross-check with cel-python (the second implementation) -----------------------------

CONDITIONS = [
    'grant.subject_id.startsWith("agent:") && request.size <= 1048576',
    'profile.safety == "High" || "Write" in profile.side_effects',
    'tenant.tier == "gpu" && subject.id != ""',
    "request.size * 2 > 100 || size(request.tags) >= 2",
    'request.tags.exists(t, t.endsWith(".md"))',
    'request.tags.all(t, t.matches("^[a-z.]+$"))',
    "has(request.path) && request.path.startsWith(\"/workspace/\")",
    'now > timestamp("2024-01-01T00:00:00Z")',
    'manifest.name in ["git", "rg"] && manifest.version != "0"',
    "!(request.size > 10) || grant.budget.calls < 5",
]

ACTIVATIONS: list[dict[str, Any]] = [
    {"request": {"size": 10, "tags": ["a.md", "b"], "path": "/workspace/x"},
     "grant": {"subject_id": "agent:1", "budget": {"calls": 3}},
     "profile": {"safety": "Low", "side_effects": ["Read"]},
     "tenant": {"tier": "gpu"}, "subject": {"id": "u1"},
     "manifest": {"name": "git", "version": "1"},
     "now": dt.datetime(2024, 6, 1, tzinfo=dt.UTC)},
    {"request": {"size": 4096, "tags": ["x"]},
     "grant": {"subject_id": "human:2", "budget": {"calls": 9}},
     "profile": {"safety": "High", "side_effects": []},
     "tenant": {"tier": "cpu"}, "subject": {"id": ""},
     "manifest": {"name": "curl", "version": "0"},
     "now": dt.datetime(2023, 6, 1, tzinfo=dt.UTC)},
]


def _celpy(source: str, data: dict[str, Any]) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(source))
    act = {k: celpy.celtypes.TimestampType(v) if isinstance(v, dt.datetime)
           else celpy.json_to_cel(v) for k, v in data.items()}
    return bool(program.evaluate(act))


@pytest.mark.parametrize("source", CONDITIONS)
def test_agrees_with_cel_python(source: str) -> None:
    cond = _compiled(source)
    for data in ACTIVATIONS:
        ours, why = cond.evaluate(data)
        assert why is None, why
        assert ours == _celpy(source, data), (source, data)


def test_variables_are_the_names_the_source_mentions() -> None:
    cond = _compiled('profile.subject_id.startsWith("agent:") && '
                     'now > timestamp("2020-01-01T00:00:00Z")')
    # a superset by design: `subject` occurs inside `subject_id`, so it is built too (harmless)
    assert cond.variables == {"profile", "now", "subject"}
    assert _compiled("request.size > 1 || grant.call_id == 'x'").variables == {"request", "grant"}


def test_evaluate_plain_agrees_with_evaluate() -> None:
    cond = _compiled('request.size <= 4 && "a" in request.tags && now.getHours() == 10')
    at_ten = dt.datetime(2024, 1, 1, 10, tzinfo=dt.UTC)
    for request in ({"size": 3, "tags": ["a"]}, {"size": 5, "tags": ["a"]}, {"size": 3},
                    {"size": "x", "tags": []}):
        context = {"request": request, "now": at_ten}
        assert cond.evaluate_plain(activation(context)) == cond.evaluate(context)


def test_plain_values_are_passed_through_and_the_rest_converted() -> None:
    plain = {"a": [1, "x", {"b": None, "c": 2.5, "d": True}], "when": dt.datetime(2024, 1, 1)}
    assert to_cel_value(plain) is plain  # nothing to convert: no copy
    mixed = {"t": (1, 2), "s": SafetyClass.HIGH, 3: frozenset({"x"}), "l": [("y",)]}
    assert to_cel_value(mixed) == {"t": [1, 2], "s": "High", "3": ["x"], "l": [["y"]]}
