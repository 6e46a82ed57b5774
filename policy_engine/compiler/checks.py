"""Stages CheckHeaders, CheckDuplicates, ResolveNames, CheckShadowed: structure and naming."""

from __future__ import annotations

from pathlib import PurePath

from policy_engine.compiler.builtins import BUILTIN_PROFILES, MANDATORY_DENY_PATHS
from policy_engine.compiler.context import CompileContext, ConsentDraft, RuleDraft, Unit
from policy_engine.dsl import ast
from policy_engine.errors import Diagnostic, Span
from policy_engine.model import FsCapability
from policy_engine.patterns import PathGlob, expand_home
from policy_engine.patterns.paths import is_literal, literal_prefix


def check_headers(ctx: CompileContext) -> None:
    """Set ``ctx.name``/``ctx.version`` from the first root file's header.

    SBP200 when the first root has none (only if a header is required), SBP215 when one file
    declares two headers or another root file declares a different name or version. Imported
    files may carry their own header (they are libraries with their own identity).
    """
    first: ast.Header | None = None
    for unit in ctx.units:
        headers = unit.file.headers
        for extra in headers[1:]:
            ctx.report("SBP215", "second `policy` header in one file", extra.span,
                       help=f"`{unit.file.file}` already declares `{headers[0].name.value}` "
                            f"at line {headers[0].span.line}")
        if not unit.root:
            continue
        if first is None:
            if headers:
                first = headers[0]
            elif ctx.require_header and _is_first_root(ctx, unit) and not _unparsed(ctx, unit):
                ctx.report("SBP200", f"`{unit.file.file}` has no `policy` header",
                           Span(unit.file.file, 1, 1))
            continue
        if headers and (headers[0].name.value, headers[0].version.value) != (
                first.name.value, first.version.value):
            h = headers[0]
            ctx.report(
                "SBP215",
                f"`{h.name.value}` version `{h.version.value}` conflicts with "
                f"`{first.name.value}` version `{first.version.value}`",
                h.span,
                help=f"files compiled together share the header of `{first.span.file}`; "
                     "use the same name and version or drop this header",
            )
    if first is not None:
        ctx.name, ctx.version = first.name.value, first.version.value
        if not first.name.value:
            ctx.report("SBP213", "policy name is empty", first.name.span)
        if not first.version.value:
            ctx.report("SBP213", "policy version is empty", first.version.span)


def _unparsed(ctx: CompileContext, unit: Unit) -> bool:
    """Whether the file had a parse error (SBP1xx): its items, header included, are unknown, and
    "no header" would be a false second error."""
    return any(d.id < "SBP200" and d.span is not None and d.span.file == unit.file.file
               for d in ctx.diagnostics)


def _is_first_root(ctx: CompileContext, unit: Unit) -> bool:
    return next((u for u in ctx.units if u.root), None) is unit


def check_duplicates(ctx: CompileContext) -> None:
    """Assign rule ids and report SBP201 for names defined twice across all units.

    A rule's id is its name, else ``<file stem>:<line>``; profiles and tools are unique by name.
    Fills ``ctx.rules`` and ``ctx.consents`` with drafts (one per top-level rule / consent).
    """
    seen_rules: dict[str, Span] = {}
    seen_profiles: dict[str, Span] = {}
    seen_tools: dict[str, Span] = {}
    for unit in ctx.units:
        stem = PurePath(unit.file.file).stem
        for item in unit.file.items:
            if isinstance(item, ast.Rule):
                rid = _unique_id(ctx, item, stem, seen_rules)
                ctx.rules.append(RuleDraft(item, rid, unit))
            elif isinstance(item, ast.Consent):
                cid = f"consent:{stem}:{item.span.line}"
                ctx.consents.append(ConsentDraft(item, cid, unit))
            elif isinstance(item, ast.ProfileDef):
                _claim(ctx, "profile", item.name, seen_profiles)
            elif isinstance(item, ast.ToolDef):
                _claim(ctx, "tool", item.name, seen_tools)
                names: dict[str, Span] = {}
                for permit in item.permits:
                    if permit.name is not None:
                        _claim(ctx, "permission", permit.name, names)


def _unique_id(ctx: CompileContext, rule: ast.Rule, stem: str, seen: dict[str, Span]) -> str:
    if rule.name is not None:
        if not rule.name.value:
            ctx.report("SBP213", "rule name is empty", rule.name.span)
        _claim(ctx, "rule", rule.name, seen)
        return rule.name.value
    rid = f"{stem}:{rule.span.line}"
    n = 2
    while rid in seen:  # two unnamed rules on one line, or two files with the same stem
        rid = f"{stem}:{rule.span.line}#{n}"
        n += 1
    seen[rid] = rule.span
    return rid


def _claim(ctx: CompileContext, what: str, name: ast.Str, seen: dict[str, Span]) -> None:
    first = seen.get(name.value)
    if first is None:
        seen[name.value] = name.span
        return
    ctx.report("SBP201", f"{what} `{name.value}` is defined twice", name.span,
               help=f"first defined at {first}; names must be unique across imports")


def resolve_names(ctx: CompileContext) -> None:
    """SBP202 for a tool block naming a profile that is neither defined nor built in."""
    known = set(BUILTIN_PROFILES)
    for unit in ctx.units:
        known.update(i.name.value for i in unit.file.items if isinstance(i, ast.ProfileDef))
    for unit in ctx.units:
        for item in unit.file.items:
            if not isinstance(item, ast.ToolDef):
                continue
            for setting in item.settings:
                if setting.key != "profile" or not isinstance(setting, ast.Setting):
                    continue
                value = setting.value
                if isinstance(value, ast.Str) and value.value not in known:
                    ctx.report("SBP202", f"profile `{value.value}` is not defined", value.span,
                               help="define it with `profile \"" + value.value + "\" { ... }` "
                                    "or use a built-in: " + ", ".join(sorted(BUILTIN_PROFILES)))


def check_shadowed(ctx: CompileContext) -> None:
    """SBP216 (warning) for a permit whose every path lies under a mandatory deny.

    A literal path is shadowed when a mandatory glob matches it; a glob is shadowed when its
    literal prefix is matched by a mandatory glob ending in ``/**`` (everything beneath is too).
    """
    mandatory = [PathGlob.of(p, ctx.home) for p in MANDATORY_DENY_PATHS]
    for draft in ctx.rules:
        if draft.node.effect == "forbid" and draft.node.mandatory:
            for cap in draft.capabilities.values():
                if isinstance(cap, FsCapability):
                    mandatory.extend(PathGlob.of(p, ctx.home) for p in cap.paths)
    for draft in ctx.rules:
        if draft.node.effect != "permit":
            continue
        for kind, cap in draft.capabilities.items():
            if isinstance(cap, FsCapability) and all(
                    _shadowed(expand_home(p, ctx.home), mandatory) for p in cap.paths):
                ctx.diagnostics.append(Diagnostic.make(
                    "SBP216", f"`{kind}` of rule `{draft.id}` only covers paths that a "
                              "mandatory deny forbids", draft.node.span))


def _shadowed(pattern: str, mandatory: list[PathGlob]) -> bool:
    if is_literal(pattern):
        return any(g.matches(pattern) for g in mandatory)
    prefix = literal_prefix(pattern)
    return any(g.pattern.endswith("/**") and g.matches(prefix) for g in mandatory)
