"""Stage ValidateResources: check each rule's kinds and resources, build its capabilities.

Which resources a capability takes (anything else is SBP212):

=============  ===========================================  ===========
kind           resources                                    required
=============  ===========================================  ===========
fs.*           paths                                        paths
net.http       hosts ports schemes methods mime             hosts
browser.use    hosts scopes schemes ports                   hosts
proc.exec      tool (with args) env                         tool
tmp.use        max_bytes                                    -
sys.gpu        class                                        -
=============  ===========================================  ===========
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from policy_engine.compiler.context import CompileContext
from policy_engine.compiler.values import ValueProblem, build_limits, parse_int, parse_size
from policy_engine.dsl import ast
from policy_engine.errors import Diagnostic, Span
from policy_engine.model import ArgAlternative, ArgSlot, BrowserScope, Capability, CapabilityKind
from policy_engine.patterns import validate_glob, validate_host_pattern
from policy_engine.patterns.paths import path_variable, validate_policy_glob
from policy_engine.patterns.regex import regex_problem

_FS = ("paths",)
ACCEPTS: dict[CapabilityKind, tuple[str, ...]] = {
    CapabilityKind.FS_READ: _FS,
    CapabilityKind.FS_WRITE: _FS,
    CapabilityKind.FS_LIST: _FS,
    CapabilityKind.NET_HTTP: ("hosts", "ports", "schemes", "methods", "mime"),
    CapabilityKind.BROWSER_USE: ("hosts", "scopes", "schemes", "ports"),
    CapabilityKind.PROC_EXEC: ("tool", "env"),
    CapabilityKind.TMP_USE: ("max_bytes",),
    CapabilityKind.SYS_GPU: ("class",),
}
REQUIRES: dict[CapabilityKind, tuple[str, ...]] = {
    CapabilityKind.FS_READ: _FS, CapabilityKind.FS_WRITE: _FS, CapabilityKind.FS_LIST: _FS,
    CapabilityKind.NET_HTTP: ("hosts",), CapabilityKind.BROWSER_USE: ("hosts",),
    CapabilityKind.PROC_EXEC: ("tool",),
}
SCHEMES = ("http", "https")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MIME = re.compile(r"^(\*/\*|[a-z0-9][a-z0-9.+-]*/(\*|[a-z0-9][a-z0-9.+-]*))$")
_CAPABILITY: TypeAdapter[Capability] = TypeAdapter(Capability)


def validate_resources(ctx: CompileContext) -> None:
    """Fill each top-level rule draft's ``capabilities`` and ``limits`` (``~`` unexpanded)."""
    for draft in ctx.rules:
        rule = draft.node
        draft.capabilities = build_capabilities(rule, ctx.diagnostics)
        if rule.mandatory and rule.effect == "permit":
            ctx.report("SBP213", "only `forbid` rules can be `mandatory`", rule.span)
        blocks = [c for c in rule.clauses if isinstance(c, ast.LimitsBlock)]
        if blocks and rule.effect == "forbid":
            ctx.report("SBP212", "`limits` apply to `permit` rules only", blocks[0].span)
        elif len(blocks) > 1:
            ctx.report("SBP201", "`limits` given twice in one rule", blocks[1].span)
        elif blocks:
            draft.limits = build_limits(blocks, ctx.diagnostics)
        env = [c for c in rule.clauses if isinstance(c, ast.EnvClause)]
        if env and rule.effect == "forbid":
            ctx.report("SBP212", "`env` applies to `permit` rules only", env[0].span,
                       help="a forbid refuses the tool whatever its environment")
        conditions = [c for c in rule.clauses if isinstance(c, ast.Cel)]
        if len(conditions) > 1:
            ctx.report("SBP201", "`when` given twice in one rule", conditions[1].span,
                       help="combine the conditions with `&&`")


def build_capabilities(rule: ast.Rule, diags: list[Diagnostic]) -> dict[CapabilityKind, Any]:
    """One capability per kind the rule names; problems are appended to ``diags``."""
    kinds: list[CapabilityKind] = []
    for word in rule.kinds:
        try:
            kind = CapabilityKind(word.value)
        except ValueError:
            diags.append(Diagnostic.make("SBP214", f"unknown capability `{word.value}`",
                                         word.span))
            continue
        if kind in kinds:
            diags.append(Diagnostic.make("SBP201", f"capability `{kind}` listed twice",
                                         word.span))
            continue
        kinds.append(kind)
    fields: dict[str, Any] = {}
    seen: dict[str, Span] = {}
    before = len(diags)
    for clause in rule.clauses:
        name = _clause_name(clause)
        if name is None:
            continue
        if name in seen:
            diags.append(Diagnostic.make("SBP201", f"`{name}` given twice in one rule",
                                         clause.span, help=f"first given at {seen[name]}"))
            continue
        seen[name] = clause.span
        for kind in kinds:
            if name not in ACCEPTS[kind]:
                diags.append(Diagnostic.make(
                    "SBP212", f"`{name}` is not a resource of `{kind}`", clause.span,
                    help=f"`{kind}` takes: " + ", ".join(f"`{a}`" for a in ACCEPTS[kind]),
                ))
        fields.update(_clause_fields(clause, diags))
        if rule.effect != "permit":
            _fixed_paths(clause, diags)
    out: dict[CapabilityKind, Any] = {}
    for kind in kinds:
        missing = [r for r in REQUIRES.get(kind, ()) if r not in seen]
        if missing:
            diags.append(Diagnostic.make(
                "SBP213", f"`{kind}` needs `{missing[0]}`", rule.span,
                help=f"e.g. `{rule.effect} {kind} {_example(missing[0])}`",
            ))
            continue
        data = {k: v for k, v in fields.items() if _field_resource(k) in ACCEPTS[kind]}
        try:
            out[kind] = _CAPABILITY.validate_python({"kind": kind.value, **data})
        except ValidationError as exc:
            if len(diags) == before:  # else the cause is already reported, more precisely
                diags.append(Diagnostic.make(
                    "SBP213", f"invalid `{kind}` capability: {_first_error(exc)}", rule.span))
    return out


def _fixed_paths(clause: ast.Clause, diags: list[Diagnostic]) -> None:
    """A forbid names fixed paths: a variable resolved per call (``$SESSION``) could leave
    a mandatory deny unresolved outside a session, so only permits take one."""
    if not (isinstance(clause, ast.Resource) and clause.name == "paths"):
        return
    for value in clause.values:
        if isinstance(value, ast.Str) and path_variable(value.value) is not None \
                and validate_policy_glob(value.value) is None:
            diags.append(Diagnostic.make("SBP206", str(validate_glob(value.value)), value.span))


def _clause_name(clause: ast.Clause) -> str | None:
    if isinstance(clause, ast.Resource):
        return clause.name
    if isinstance(clause, ast.ToolClause):
        return "tool"
    if isinstance(clause, ast.EnvClause):
        return "env"
    if isinstance(clause, ast.Scalar):
        return clause.name
    return None


def _field_resource(field: str) -> str:
    return {"args": "tool", "class": "class", "max_bytes": "max_bytes"}.get(field, field)


def _example(resource: str) -> str:
    return {"paths": 'paths ["/workspace/**"]', "hosts": 'hosts ["api.example.com"]',
            "tool": 'tool "git" args ["status"]'}.get(resource, resource)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"][1:])
    return f"{loc}: {err['msg'].lower()}" if loc else err["msg"].lower()


def _clause_fields(clause: ast.Clause, diags: list[Diagnostic]) -> dict[str, Any]:
    if isinstance(clause, ast.ToolClause):
        out: dict[str, Any] = {"tool": clause.tool.value}
        if not clause.tool.value:
            diags.append(Diagnostic.make("SBP213", "empty tool name", clause.tool.span))
        if clause.args is not None:
            out["args"] = tuple(_slot(s, diags) for s in clause.args)
        return out
    if isinstance(clause, ast.EnvClause):
        return {"env": tuple(a for a in (_env_name(n, diags) for n in clause.names)
                             if a is not None)}
    if isinstance(clause, ast.Scalar):
        return _scalar(clause, diags)
    if isinstance(clause, ast.Resource):
        if not clause.values and clause.name in ("paths", "hosts", "scopes"):
            diags.append(Diagnostic.make("SBP213", f"`{clause.name}` is empty", clause.span,
                                         help="a rule that covers nothing can be removed"))
        return {clause.name: tuple(v for v in (_item(clause.name, x, diags)
                                               for x in clause.values) if v is not None)}
    return {}


def _shown(regex: str) -> str:
    return regex if len(regex) <= 60 else regex[:57] + "..."


def _env_name(alt: ast.ArgAlt, diags: list[Diagnostic]) -> ArgAlternative | None:
    """One entry of an ``env`` list: a variable name, or a regex searched in the name."""
    if alt.regex is not None:
        problem = regex_problem(alt.regex)
        if problem is not None:
            diags.append(Diagnostic.make(
                "SBP208", f"invalid regex `/{_shown(alt.regex)}/`: {problem}", alt.span))
            return None
        return ArgAlternative(regex=alt.regex)
    name = alt.literal or ""
    if _ENV_NAME.fullmatch(name) is None:
        diags.append(Diagnostic.make(
            "SBP213", f"invalid environment variable name {name!r}", alt.span,
            help="a name is letters, digits and `_`, not starting with a digit"))
        return None
    return ArgAlternative(literal=name)


def _slot(slot: ast.ArgSlotNode, diags: list[Diagnostic]) -> ArgSlot:
    alts: list[ArgAlternative] = []
    for alt in slot.alternatives:
        if alt.regex is not None:
            problem = regex_problem(alt.regex)
            if problem is not None:
                diags.append(Diagnostic.make(
                    "SBP208", f"invalid regex `/{_shown(alt.regex)}/`: {problem}", alt.span))
                continue
            alts.append(ArgAlternative(regex=alt.regex))
        else:
            alts.append(ArgAlternative(literal=alt.literal))
    if not alts:
        alts.append(ArgAlternative(literal=""))
    return ArgSlot(alternatives=tuple(alts), repeat=slot.repeat)


def _scalar(clause: ast.Scalar, diags: list[Diagnostic]) -> dict[str, Any]:
    value = clause.value
    if clause.name == "max_bytes":
        if not isinstance(value, ast.Quantity):
            diags.append(Diagnostic.make("SBP213", "`max_bytes` takes a size, e.g. `64MiB`",
                                         value.span))
            return {}
        try:
            return {"max_bytes": parse_size(value)}
        except ValueProblem as exc:
            diags.append(Diagnostic.make(exc.diag_id, exc.message, value.span))
            return {}
    text = value.value if isinstance(value, ast.Str | ast.Word) else value.text
    if not text:
        diags.append(Diagnostic.make("SBP213", "empty GPU class", value.span))
        return {}
    return {"class": text}


def _item(resource: str, value: ast.Value, diags: list[Diagnostic]) -> Any:
    """One list element of ``resource``, validated; ``None`` (and a diagnostic) if invalid."""
    def bad(diag_id: str, message: str) -> None:
        diags.append(Diagnostic.make(diag_id, message, value.span))

    if resource == "ports":
        if not isinstance(value, ast.Quantity):
            return bad("SBP213", "ports are numbers, e.g. `443`")
        try:
            port = parse_int(value)
        except ValueProblem as exc:
            return bad(exc.diag_id, exc.message)
        if not 1 <= port <= 65535:
            return bad("SBP213", f"port `{port}` is outside 1-65535")
        return port
    if resource == "scopes":
        text = value.value if isinstance(value, ast.Str | ast.Word) else value.text
        if text not in {s.value for s in BrowserScope}:
            return bad("SBP213", f"unknown browser scope `{text}` (open, extract, screenshot)")
        return BrowserScope(text)
    if not isinstance(value, ast.Str):
        shown = value.value if isinstance(value, ast.Word) else value.text
        return bad("SBP213", f"`{resource}` takes strings; quote `{shown}`")
    return _check_string(resource, value.value, bad)


def _check_string(resource: str, text: str, bad: Any) -> Any:
    if resource == "paths":
        problem = validate_policy_glob(text)  # a forbid's variable: ``_fixed_paths``
        return bad("SBP206", problem) if problem else text
    if resource == "hosts":
        problem = validate_host_pattern(text)
        return bad("SBP207", problem) if problem else text
    if resource == "schemes":
        return text.lower() if text.lower() in SCHEMES else bad(
            "SBP213", f"unknown scheme `{text}` (http, https)")
    if resource == "methods":
        return text.upper() if text.upper() in METHODS else bad(
            "SBP213", f"unknown HTTP method `{text}`")
    if resource == "mime":
        return text.lower() if _MIME.match(text.lower()) else bad(
            "SBP213", f"invalid MIME type `{text}` (`type/subtype`, `type/*` or `*/*`)")
    return text
