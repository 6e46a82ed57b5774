"""Lint JSON/YAML documents: validate each as the engine loads it, and hold the capabilities of
manifests and grants to the rules a policy's permits get (SBP300-SBP303, SBP310-SBP313,
SBP320-SBP321), each finding at the value's line and column.

The rules that compare a permit with other rules (SBP330, SBP335-SBP339) need a policy and do
not apply; JSON has no comments, so a document's findings are suppressed by a
``.sbpolicy-ignore.yaml`` beside it (docignore.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from policy_engine.compiler.builtins import MANDATORY_DENY_PATHS
from policy_engine.compiler.loaders import PositionLookup
from policy_engine.documents import DocumentReport, check_document
from policy_engine.errors import Span
from policy_engine.guard.env import is_hijack
from policy_engine.lint.cover import may_contain, may_meet
from policy_engine.lint.model import Finding, LintConfig
from policy_engine.lint.psl import public_suffix
from policy_engine.lint.rules.base import finding
from policy_engine.lint.rules.breadth import EXTRA_SECRETS, is_any_host
from policy_engine.lint.rules.network import WRITE_METHODS
from policy_engine.lint.rules.process import (
    LAUNCHERS,
    SHELLS,
    inline_slot,
    interpreter,
    unconstrained,
)
from policy_engine.model import (
    BrowserCapability,
    Capability,
    FsCapability,
    Grant,
    Manifest,
    NetHttpCapability,
    ProcCapability,
)
from policy_engine.patterns import HostPattern, expand_home
from policy_engine.patterns.path_meet import contains, disjoint

Loc = tuple[str | int, ...]


def lint_document(path: str, cfg: LintConfig, kind: str | None, *,
                  walked: bool) -> tuple[DocumentReport, list[Finding]] | None:
    """The report of checking ``path`` and the SBP3xx findings of its capabilities; ``None``
    for a file found in a directory walk that parses but is no engine document (a
    ``package.json``, a CI workflow): it is not ours to judge."""
    report = check_document(path, kind)
    if walked and report.kind is None and report.lookup is not None:
        return None
    return report, capability_findings(report, cfg)


def capability_findings(report: DocumentReport, cfg: LintConfig) -> list[Finding]:
    """The SBP3xx findings of a valid manifest's permissions or grant's capabilities."""
    model, lookup = report.model, report.lookup
    if lookup is None:
        return []
    if isinstance(model, Manifest):
        caps, key, what = model.permissions, "permissions", f"manifest `{model.name}`"
    elif isinstance(model, Grant):
        caps, key, what = model.capabilities, "capabilities", f"grant `{model.call_id}`"
    else:
        return []
    found = [f for i, cap in enumerate(caps)
             for f in _check(cap, _At(lookup, (key, i), f"{key}[{i}] of {what}"), cfg)]
    return [f for f in found if cfg.enabled(f.id)]


class _At:
    """Where a capability was written and how messages name it."""

    def __init__(self, lookup: PositionLookup, loc: Loc, name: str) -> None:
        self.lookup, self.loc, self.name = lookup, loc, name

    def span(self, *more: str | int) -> Span:
        return self.lookup.span((*self.loc, *more))

    def finding(self, rule_id: str, message: str, *more: str | int,
                help: str | None = None) -> Finding:
        span = self.span(*more)
        return finding(rule_id, message, span, span.line, help=help)


def _check(cap: Capability, at: _At, cfg: LintConfig) -> Iterator[Finding]:
    if isinstance(cap, FsCapability):
        yield from _paths(cap.paths, at, cfg.home)
    elif isinstance(cap, NetHttpCapability | BrowserCapability):
        yield from _hosts(cap, at)
    elif isinstance(cap, ProcCapability):
        yield from _proc(cap, at)


def _paths(paths: Sequence[str], at: _At, home: str) -> Iterator[Finding]:
    """SBP300 and SBP303, measured against the built-in mandatory denies."""
    builtin = [(p, expand_home(p, home)) for p in MANDATORY_DENY_PATHS]
    secrets = [(s, expand_home(s, home)) for s in EXTRA_SECRETS]
    unprotected = [(s, e) for s, e in secrets if not any(contains(m, e) for _, m in builtin)]
    for j, written in enumerate(paths):
        glob = expand_home(written, home)
        covered = [w for w, m in builtin if may_contain(glob, m) and contains(glob, m)]
        if covered:
            more = f" and {len(covered) - 1} more" if len(covered) > 1 else ""
            yield at.finding("SBP300", f"`{written}` in {at.name} contains the mandatory deny "
                             f"`{covered[0]}`{more}", "paths", j)
        reached = [s for s, e in unprotected if may_meet(glob, e) and not disjoint(glob, e)]
        if reached:
            more = f" and {len(reached) - 3} more" if len(reached) > 3 else ""
            yield at.finding("SBP303", f"`{written}` in {at.name} reaches "
                             + ", ".join(f"`{s}`" for s in reached[:3]) + more
                             + " with no mandatory deny", "paths", j)


def _hosts(cap: NetHttpCapability | BrowserCapability, at: _At) -> Iterator[Finding]:
    """SBP301, SBP302, SBP320 and (net.http) SBP321."""
    anywhere = None
    for j, written in enumerate(cap.hosts):
        try:
            host = HostPattern.of(written)
        except ValueError:  # refused on load (SBP207)
            continue
        if is_any_host(host):
            anywhere = anywhere or written
            yield at.finding("SBP301", f"{at.name} permits any host (`{written}`)", "hosts", j)
        elif host.kind == "suffix":
            why = public_suffix(host.value)
            if why is not None:
                yield at.finding("SBP302", f"`{written}` in {at.name} is a wildcard over "
                                 f"`{host.value}`, {why}", "hosts", j)
    for j, scheme in enumerate(cap.schemes):
        if scheme.lower() == "http":
            yield at.finding("SBP320", f"{at.name} permits plain `http`", "schemes", j)
    if isinstance(cap, NetHttpCapability) and anywhere is not None:
        writes = sorted({m.upper() for m in cap.methods} & WRITE_METHODS)
        if writes:
            yield at.finding("SBP321", f"{at.name} permits {', '.join(writes)} to any host "
                             f"(`{anywhere}`)", "methods")


def _proc(cap: ProcCapability, at: _At) -> Iterator[Finding]:
    """SBP310-SBP313."""
    name = cap.tool.rsplit("/", 1)[-1]
    for j, alt in enumerate(cap.env or ()):
        if alt.literal is not None and is_hijack(alt.literal):
            yield at.finding("SBP313", f"{at.name} lets a call set `{alt.literal}`, which can "
                             "make the loader, an interpreter or the tool run other code",
                             "env", j)
    if name in SHELLS or name in LAUNCHERS:
        what = "a shell" if name in SHELLS else "a program that runs other programs"
        yield at.finding("SBP310", f"{at.name} permits `{cap.tool}`, {what}", "tool")
        return
    interp = interpreter(cap.tool)
    if interp is not None:
        index = inline_slot(cap, *interp)
        if index == -1:
            yield at.finding("SBP311", f"{at.name} permits the interpreter `{cap.tool}` with "
                             "any arguments, so inline code too", "tool")
        elif index is not None:
            yield at.finding("SBP311", f"argument {index + 1} of {at.name} admits "
                             f"`{interp[0][0]}`: `{cap.tool}` would run inline code",
                             "args", index)
        return
    if unconstrained(cap):
        yield at.finding("SBP312", f"{at.name} permits `{cap.tool}` with any arguments",
                         "args" if cap.args else "tool")
