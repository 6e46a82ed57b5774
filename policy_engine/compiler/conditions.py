"""Stages CompileConditions and CheckTypes: every CEL `when` compiled once, then type-checked."""

from __future__ import annotations

from policy_engine.compiler.context import CompileContext
from policy_engine.dsl import ast
from policy_engine.dsl.cel import CelCondition, check_boolean, check_fields
from policy_engine.errors import Span

ALWAYS = "true"
"""The condition `require consent` without `when` compiles to: consent is always required."""


def compile_conditions(ctx: CompileContext) -> None:
    """Compile the `when` of each rule and consent statement (SBP209 syntax, SBP210 types and
    fields the closed schemas of the context do not have).

    cel-expr-python checks names and overloads while compiling; the result is kept on the draft
    so it is never compiled again.
    """
    for draft in ctx.rules:
        cel_node = next((c for c in draft.node.clauses if isinstance(c, ast.Cel)), None)
        if cel_node is not None:
            draft.condition = _compile(ctx, cel_node.source, cel_node.span)
    for consent in ctx.consents:
        node = consent.node
        if node.condition is not None:
            consent.condition = _compile(ctx, node.condition.source, node.condition.span)
        else:
            consent.condition = _compile(ctx, ALWAYS, node.span)


def check_types(ctx: CompileContext) -> None:
    """SBP211 for a condition whose static type is not ``bool`` (``dyn`` is checked at run time).

    Requires CompileConditions: it reads the compiled conditions, never the source.
    """
    conditions = [d.condition for d in ctx.rules] + [c.condition for c in ctx.consents]
    for cond in conditions:
        if cond is None:
            continue
        problem = check_boolean(cond)
        if problem is not None:
            ctx.diagnostics.append(problem)


def _compile(ctx: CompileContext, source: str, span: Span) -> CelCondition | None:
    result = ctx.compile_cel(source, span)
    if isinstance(result, list):
        ctx.diagnostics.extend(result)
        return None
    unknown = check_fields(result)
    if unknown:  # a field the schema lacks is never there: the condition could never hold
        ctx.diagnostics.extend(unknown)
        return None
    return result
