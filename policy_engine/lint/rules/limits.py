"""Rules SBP330-SBP332: missing timeouts, limits the org default caps, loosened seed profiles."""

from __future__ import annotations

from collections.abc import Iterator

from policy_engine.compiler.blocks import build_profile
from policy_engine.compiler.builtins import BUILTIN_PROFILES
from policy_engine.compiler.values import LIMIT_NAMES, ValueProblem
from policy_engine.dsl import ast
from policy_engine.errors import Span
from policy_engine.graph import NamedProfile
from policy_engine.lint.model import FileView, Finding, LintConfig
from policy_engine.lint.rules.base import drafts, finding, head, label
from policy_engine.model import LIMIT_FIELDS, CapabilityKind, Limits, NetworkMode
from policy_engine.patterns import expand_home
from policy_engine.patterns.path_meet import contains

_TIMED = (CapabilityKind.PROC_EXEC, CapabilityKind.NET_HTTP, CapabilityKind.BROWSER_USE)
_RANK = {NetworkMode.OFF: 0, NetworkMode.RESTRICTED: 1, NetworkMode.ON: 2}


def check_timeout(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP330: a timed permit with no timeout of its own in a policy whose defaults set none."""
    if view.policy.defaults.timeout_ms is not None:
        return
    for d in drafts(view):
        if d.node.effect != "permit" or not any(k in _TIMED for k in d.capabilities):
            continue
        if d.limits is None or d.limits.timeout_ms is None:
            kinds = ", ".join(k.value for k in d.capabilities if k in _TIMED)
            yield finding("SBP330", f"{kinds} rule {label(d.node, d.id)} has no timeout and the "
                          "policy `defaults` set none", head(d.node), d.node.span)


def _limit_items(view: FileView) -> Iterator[tuple[str, ast.Limit | ast.Setting, ast.Quantity,
                                                   Span]]:
    """(what, node, value, statement span) for every limit outside `defaults`."""
    for item in view.file.items:
        if isinstance(item, ast.Rule):
            what = f"rule {label(item)}"
            blocks = [c for c in item.clauses if isinstance(c, ast.LimitsBlock)]
            settings: tuple[ast.Setting | ast.ListSetting, ...] = ()
        elif isinstance(item, ast.ProfileDef | ast.ToolDef):
            kind = "profile" if isinstance(item, ast.ProfileDef) else "tool"
            what = f"{kind} `{item.name.value}`"
            blocks, settings = list(item.limits), item.settings
        else:
            continue
        for s in settings:
            if isinstance(s, ast.Setting) and s.key == "timeout" \
                    and isinstance(s.value, ast.Quantity):
                yield what, s, s.value, item.span
        for block in blocks:
            for lim in block.items:
                yield what, lim, lim.value, item.span


def check_above_default(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP331: a limit above the org default (the merged `defaults` of the policy) is capped."""
    defaults = view.policy.defaults
    for what, node, qty, anchor in _limit_items(view):
        name = "timeout" if isinstance(node, ast.Setting) else node.name.value
        spec = LIMIT_NAMES.get(name)
        if spec is None:
            continue
        try:
            parsed = spec.parse(qty)
        except ValueProblem:
            continue
        parts = parsed if isinstance(parsed, tuple) else (parsed,)
        for field, value in zip(spec.fields, parts, strict=True):
            default = getattr(defaults, field)
            if default is not None and value > default:
                yield finding(
                    "SBP331", f"`{name} {qty.text}` of {what} is above the org default "
                    f"({_show(field, default)}) and has no effect: limits only narrow",
                    qty.span, anchor)
                break


def _show(field: str, value: float) -> str:
    if field == "timeout_ms":
        return f"{value / 1000:g}s"
    if field in ("max_bytes_in", "max_bytes_out", "memory_bytes", "max_stdout_bytes",
                 "max_stderr_bytes", "disk_write_bytes"):
        return f"{value} bytes"
    return f"{value:g}"


def widened(seed: NamedProfile, prof: NamedProfile, home: str) -> list[str]:
    """What ``prof`` allows beyond ``seed``: network, fs mode, writable globs, limits."""
    out: list[str] = []
    if seed.network is not None and (prof.network is None
                                     or _RANK[prof.network] > _RANK[seed.network]):
        out.append(f"network `{prof.network.value if prof.network else 'unset'}` "
                   f"(seed: `{seed.network.value}`)")
    if seed.fs_mode == "read-only" and prof.fs_mode != "read-only":
        out.append(f"fs `{prof.fs_mode or 'unset'}` (seed: `read-only`)")
    if seed.writable is not None:
        seed_globs = [expand_home(g, home) for g in seed.writable]
        loose = [g for g in (prof.writable or ())
                 if not any(contains(s, expand_home(g, home)) for s in seed_globs)]
        if prof.writable is None or loose:
            shown = loose[0] if loose else "unset"
            out.append(f"writable `{shown}` (seed: `{', '.join(seed.writable)}`)")
    out.extend(_limits_widened(seed.limits, prof.limits))
    return out


def _limits_widened(seed: Limits, prof: Limits) -> Iterator[str]:
    names = {f: n for n, spec in LIMIT_NAMES.items() for f in spec.fields}
    for field in LIMIT_FIELDS:
        want, got = getattr(seed, field), getattr(prof, field)
        if want is not None and (got is None or got > want):
            shown = "unset" if got is None else _show(field, got)
            yield f"{names.get(field, field)} {shown} (seed: {_show(field, want)})"


def check_profiles(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP332: a redefinition of a seed profile that is looser than the seed."""
    for item in view.file.items:
        if not isinstance(item, ast.ProfileDef):
            continue
        seed = BUILTIN_PROFILES.get(item.name.value)
        if seed is None:
            continue
        loose = widened(seed, build_profile(item, []), cfg.home)
        if loose:
            yield finding("SBP332", f"profile `{item.name.value}` is looser than the seed "
                          "profile: " + "; ".join(loose), item.name.span, item.span)


CHECKS = (check_timeout, check_above_default, check_profiles)
