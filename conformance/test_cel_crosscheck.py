"""CEL cross-check: every `when` condition of the cases and examples, evaluated by both
cel-expr-python (the engine's adapter) and cel-python on each case's real activation.

The activation is the one the guard builds for the case (``build_context`` over the compiled
profile, the resolved op and the caller's context), with every variable present. Outcomes are
compared as ``True``/``False``/``error``: an error denies in the engine, so two implementations
disagreeing on whether something is an error is a disagreement too.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
from casekit import (
    ROOT,
    Env,
    LoadedCase,
    PolicyCache,
    bound,
    grant_of,
    iter_conditions,
    load_all,
    manifest_of,
)

from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.dsl.cel import CelCondition, compile_condition
from policy_engine.errors import PolicyEngineError, Span
from policy_engine.explain.request import ExplainRequest, load_request, resolve_fixture
from policy_engine.guard import Guard
from policy_engine.guard.resolve import OP_KIND, build_context, resolve_other, resolve_path
from policy_engine.model import Grant, Manifest
from policy_engine.profile import ProfileBuilder

Outcome = bool | str  # True, False or "error"
Evaluator = Callable[[str, dict[str, Any]], Outcome]
EXAMPLES = ROOT / "examples"


def engine_outcome(source: str, activation: dict[str, Any]) -> Outcome:
    """cel-expr-python through the engine's adapter (compiled exactly as the policy compiler)."""
    cond = compile_condition(source, Span("crosscheck", 1, 1))
    assert isinstance(cond, CelCondition), cond
    value, err = cond.evaluate_plain(activation)
    return "error" if err is not None else value


def celpy_outcome(source: str, activation: dict[str, Any]) -> Outcome:
    """cel-python on the same activation (converted as tests/unit/test_cel_adapter.py does)."""
    env = celpy.Environment()
    try:
        program = env.program(env.compile(source))
        act = {k: celpy.celtypes.TimestampType(v) if isinstance(v, dt.datetime)
               else celpy.json_to_cel(v) for k, v in activation.items()}
        value = program.evaluate(act)
    except Exception:  # noqa: BLE001 - any failure of the second implementation is an "error"
        return "error"
    if isinstance(value, celpy.celtypes.BoolType):
        return bool(value)
    return "error"  # an error value, or a non-bool the engine also refuses


def crosscheck(source: str, activation: dict[str, Any], first: Evaluator = engine_outcome,
               second: Evaluator = celpy_outcome) -> str | None:
    """``None`` when both evaluators agree, else a message with the expression, the
    activation and both answers."""
    a, b = first(source, activation), second(source, activation)
    if a == b:
        return None
    shown = json.dumps(activation, default=str, sort_keys=True, indent=1)
    return (f"CEL implementations disagree on `{source}`:\n"
            f"  cel-expr-python: {a!r}\n  cel-python:      {b!r}\n  activation: {shown}")


def activation_for(ps: Any, manifest: Manifest, grant: Grant,
                   request: ExplainRequest) -> dict[str, Any] | None:
    """The full CEL context the guard would build for ``request`` (None when the op cannot
    even be resolved or the profile cannot be built: no condition is evaluated then)."""
    try:
        profile = ProfileBuilder(ps).build(grant, manifest, settings=request.settings,
                                           overrides=request.overrides)
        cp = dataclasses.replace(Guard(ps).compiled(profile), needs=None)  # every variable
        op = request.op
        kind = op.kind  # the op kind (tmp.alloc, browser.nav...), as the guard passes it
        assert kind in OP_KIND
        path = rv = None
        if kind in ("fs.read", "fs.write", "fs.list"):
            path = resolve_path(cp, op.path, True)
        else:
            rv = resolve_other(kind, op)
        extra = {"grant": grant.model_dump(mode="json"),
                 "manifest": manifest.model_dump(mode="json"),
                 "tenant": request.context.get("tenant", {"id": grant.tenant}),
                 "subject": request.context.get("subject", {"id": grant.subject_id})}
        now = request.now_ms if request.now_ms is not None else 0
        return build_context(cp, op, kind, path, rv, now, extra)
    except PolicyEngineError:
        return None


def _case_conditions(lc: LoadedCase, case: Any, scratch: Path) -> list[str]:
    files = [case.policy] if isinstance(case.policy, str) else list(case.policy or ())
    paths = [(lc.file.parent / f).resolve() for f in files]
    if case.policy_text is not None:
        inline = scratch / "inline.sbpolicy"
        inline.write_text(case.policy_text)
        paths.append(inline)
    imported = [p for f in paths for p in _imports(f)]
    return [src for src, _span in iter_conditions([*paths, *imported])]


def _imports(path: Path) -> list[Path]:
    text = path.read_text()
    return [path.parent / line.split('"')[1] for line in text.splitlines()
            if line.startswith("import ")]


def _example_conditions() -> list[str]:
    files = sorted(EXAMPLES.glob("policies/*.sbpolicy")) + sorted(
        EXAMPLES.glob("manifests/*.sbpolicy"))
    return sorted({src for src, _span in iter_conditions(files)})


def _checks(tmp: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, condition, activation) for every case and example request."""
    env = Env(workspace=tmp / "workspace")
    policies = PolicyCache(tmp / "policies")
    for lc in load_all():
        case = bound(lc, env)
        scratch = tmp / "inline" / case.note.replace("/", ".")
        scratch.mkdir(parents=True)
        conditions = _case_conditions(lc, case, scratch)
        if not conditions:
            continue
        ps = policies.policyset(case, lc.file.parent)
        act = activation_for(ps, manifest_of(case, lc.file.parent),
                             grant_of(case, lc.file.parent), case.request.explain_request())
        if act is not None:
            for source in conditions:
                yield lc.where, source, act
    org = policies.policyset_of_files([EXAMPLES / "policies" / "org.sbpolicy"])
    example_conditions = _example_conditions()
    for request_path in sorted((EXAMPLES / "requests").glob("*.json")):
        request = load_request(request_path)
        act = activation_for(
            org, load_manifest(resolve_fixture(request_path, request.manifest, "manifest")),
            load_grant(resolve_fixture(request_path, request.grant, "grant")), request)
        if act is not None:
            for source in example_conditions:
                yield str(request_path.relative_to(ROOT)), source, act


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, dict[str, Any]]]:
    return list(_checks(tmp_path_factory.mktemp("celcheck")))


def test_both_implementations_agree_on_every_case_activation(
        checks: list[tuple[str, str, dict[str, Any]]]) -> None:
    conditions = {source for _w, source, _a in checks}
    # the cases and examples really carry conditions over every context variable
    assert len(conditions) >= 10
    for var in ("request", "grant", "manifest", "profile", "tenant", "subject", "now"):
        assert any(var in c for c in conditions), f"no condition reads `{var}`"
    failures = [f"{where}: {msg}" for where, source, act in checks
                if (msg := crosscheck(source, act)) is not None]
    assert not failures, "\n\n".join(failures)
    outcomes = {engine_outcome(s, a) for _w, s, a in checks}
    assert outcomes == {True, False, "error"}  # the activations exercise every outcome


def test_example_conditions_are_collected() -> None:
    found = _example_conditions()
    assert any(c.startswith('grant.subject_id.startsWith("agent:")') for c in found)
    assert any('"Write" in profile.side_effects' in c for c in found)


def test_checker_reports_a_disagreement_with_both_answers() -> None:
    """A second evaluator that answers differently (a deliberately wrong one: cel-python's
    answer negated) must be caught, with the expression and both answers shown."""
    def contrary(source: str, activation: dict[str, Any]) -> Outcome:
        answer = celpy_outcome(source, activation)
        return (not answer) if isinstance(answer, bool) else True

    source = 'request.size <= 4 && subject.id.startsWith("agent:")'
    activation = {"request": {"size": 3}, "subject": {"id": "agent:a"}}
    assert crosscheck(source, activation) is None  # the real pair agrees here
    msg = crosscheck(source, activation, engine_outcome, contrary)
    assert msg is not None
    assert source in msg
    assert "cel-expr-python: True" in msg
    assert "cel-python:      False" in msg
    assert '"agent:a"' in msg
    # an error on one side only is a disagreement too
    assert crosscheck("request.missing == 1", {"request": {}}) is None
    assert crosscheck("request.missing == 1", {"request": {}}, engine_outcome,
                      lambda s, a: False) is not None
