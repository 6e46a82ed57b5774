"""Stage CheckBlocks: `defaults`, `profile` and `tool` blocks into Limits, NamedProfiles, Manifests.

Paths stay unexpanded here (ExpandHome runs later, after the version hash is taken).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from policy_engine.compiler.context import CompileContext
from policy_engine.compiler.resources import build_capabilities
from policy_engine.compiler.values import build_limits
from policy_engine.dsl import ast
from policy_engine.errors import Diagnostic
from policy_engine.graph import NamedProfile
from policy_engine.model import Isolation, Manifest, NetworkMode, SafetyClass, SideEffect
from policy_engine.patterns import validate_glob

_FS_MODES = ("read-only", "read-write")


def check_blocks(ctx: CompileContext) -> None:
    """Fill ``ctx.defaults``, ``ctx.network``, ``ctx.profiles`` and ``ctx.tools``."""
    defaults = [i for u in ctx.units for i in u.file.items if isinstance(i, ast.Defaults)]
    _defaults(ctx, defaults)
    for unit in ctx.units:
        for item in unit.file.items:
            if isinstance(item, ast.ProfileDef) and item.name.value not in ctx.profiles:
                ctx.profiles[item.name.value] = build_profile(item, ctx.diagnostics)
            elif isinstance(item, ast.ToolDef) and item.name.value not in ctx.tools:
                manifest = build_manifest(item, ctx.diagnostics)
                if manifest is not None:
                    ctx.tools[item.name.value] = manifest


def _single(settings: list[ast.Setting], key: str, diags: list[Diagnostic]) -> ast.Setting | None:
    found = [s for s in settings if s.key == key]
    for extra in found[1:]:
        diags.append(Diagnostic.make("SBP201", f"`{key}` is set twice", extra.span,
                                     help=f"first set at {found[0].span}"))
    return found[0] if found else None


def _defaults(ctx: CompileContext, blocks: list[ast.Defaults]) -> None:
    settings = [s for b in blocks for s in b.settings]
    network = _single(settings, "network", ctx.diagnostics)
    if network is not None:
        mode = network_mode(network.value, ctx.diagnostics)
        if mode is not None:
            ctx.network = mode
    ctx.defaults = build_limits(
        [lb for b in blocks for lb in b.limits], ctx.diagnostics,
        timeout=_single(settings, "timeout", ctx.diagnostics),
    )


def network_mode(value: ast.Value, diags: list[Diagnostic]) -> NetworkMode | None:
    text = _text(value)
    try:
        return NetworkMode(text)
    except ValueError:
        diags.append(Diagnostic.make("SBP213", f"unknown network mode `{text}`", value.span,
                                     help="network modes: off, restricted, on"))
        return None


def _text(value: ast.Value) -> str:
    return value.text if isinstance(value, ast.Quantity) else value.value


def build_profile(node: ast.ProfileDef, diags: list[Diagnostic]) -> NamedProfile:
    """A named profile; invalid settings are reported and left unset."""
    plain = [s for s in node.settings if isinstance(s, ast.Setting)]
    lists = [s for s in node.settings if isinstance(s, ast.ListSetting)]
    network = _single(plain, "network", diags)
    fs = _single(plain, "fs", diags)
    fs_mode: Any = None
    if fs is not None:
        if _text(fs.value) in _FS_MODES:
            fs_mode = _text(fs.value)
        else:
            diags.append(Diagnostic.make("SBP213", f"unknown fs mode `{_text(fs.value)}`",
                                         fs.value.span, help="fs modes: read-only, read-write"))
    isolation = _isolation(_single(plain, "isolation", diags), diags)
    writable: tuple[str, ...] | None = None
    for extra in lists[1:]:
        diags.append(Diagnostic.make("SBP201", "`writable` is set twice", extra.span))
    if lists:
        writable = tuple(_globs(lists[0].values, diags))
    return NamedProfile(
        name=node.name.value, span=node.span,
        network=network_mode(network.value, diags) if network is not None else None,
        fs_mode=fs_mode, writable=writable,
        limits=build_limits(node.limits, diags, timeout=_single(plain, "timeout", diags)),
        isolation=isolation,
    )


def _isolation(setting: ast.Setting | None, diags: list[Diagnostic]) -> Isolation | None:
    if setting is None:
        return None
    text = _text(setting.value)
    try:
        return Isolation(text)
    except ValueError:
        levels = ", ".join(i.value for i in Isolation)
        diags.append(Diagnostic.make("SBP213", f"unknown isolation `{text}`", setting.value.span,
                                     help=f"isolation levels: {levels}"))
        return None


def _globs(values: tuple[ast.Value, ...], diags: list[Diagnostic]) -> list[str]:
    out: list[str] = []
    for v in values:
        if not isinstance(v, ast.Str):
            diags.append(Diagnostic.make("SBP213", f"quote the path `{_text(v)}`", v.span))
            continue
        problem = validate_glob(v.value)
        if problem:
            diags.append(Diagnostic.make("SBP206", problem, v.span))
        else:
            out.append(v.value)
    return out


def build_manifest(node: ast.ToolDef, diags: list[Diagnostic]) -> Manifest | None:
    """The Manifest a `tool` block declares; its `permit` rules become its permissions."""
    plain = [s for s in node.settings if isinstance(s, ast.Setting)]
    lists = [s for s in node.settings if isinstance(s, ast.ListSetting)]
    data: dict[str, Any] = {"name": node.name.value, "version": node.version.value}
    permissions: list[Any] = []
    for permit in node.permits:
        permissions.extend(build_capabilities(permit, diags).values())
    data["permissions"] = tuple(permissions)
    desc = _single(plain, "description", diags)
    if desc is not None:
        data["description"] = _text(desc.value)
    profile = _single(plain, "profile", diags)
    if profile is not None:
        data["profile"] = _text(profile.value)
    network = _single(plain, "network", diags)
    if network is not None:
        data["network"] = network_mode(network.value, diags)
    safety = _single(plain, "safety", diags)
    if safety is not None:
        data["safety_class"] = _enum(SafetyClass, safety.value, "safety class", diags)
    for extra in lists[1:]:
        diags.append(Diagnostic.make("SBP201", "`side_effects` is set twice", extra.span))
    if lists:
        effects = [_enum(SideEffect, v, "side effect", diags) for v in lists[0].values]
        data["side_effects"] = tuple(e for e in effects if e is not None)
    data["limits"] = build_limits(node.limits, diags, timeout=_single(plain, "timeout", diags))
    data = {k: v for k, v in data.items() if v is not None}
    try:
        return Manifest(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        diags.append(Diagnostic.make(
            "SBP213", f"invalid tool `{node.name.value}`: "
                      f"{'.'.join(map(str, err['loc']))}: {err['msg'].lower()}", node.span))
        return None


def _enum(enum: Any, value: ast.Value, what: str, diags: list[Diagnostic]) -> Any:
    text = _text(value)
    for member in enum:
        if member.value.lower() == text.lower():
            return member
    diags.append(Diagnostic.make(
        "SBP213", f"unknown {what} `{text}`", value.span,
        help=f"{what}s: " + ", ".join(m.value for m in enum),
    ))
    return None
