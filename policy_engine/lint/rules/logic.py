"""Rules SBP335-SBP339 and SBP342: constant conditions, duplicate rules, unreachable permits
(and where those checks stopped on a file too large to compare pairwise)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from policy_engine.analysis.containment import covers as exact_covers
from policy_engine.compiler.context import RuleDraft
from policy_engine.dsl import ast
from policy_engine.lint.cover import covers, segments
from policy_engine.lint.model import FileView, Finding, LintConfig
from policy_engine.lint.rules.base import (
    drafts,
    finding,
    head,
    label,
    rule_views,
    unconditional,
    where,
)
from policy_engine.model import Capability, CapabilityKind, FsCapability, ProcCapability

_FS = (CapabilityKind.FS_READ, CapabilityKind.FS_WRITE, CapabilityKind.FS_LIST)
_FORBID_COVERABLE = (*_FS, CapabilityKind.PROC_EXEC)
"""Kinds where a forbid's match is the same set test as a permit's (net forbids differ in how
unset methods/ports are read, so they are left out rather than guessed)."""


def check_conditions(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP335/SBP336: a condition that names no context variable is a constant; evaluate it."""
    for d in drafts(view):
        cond = d.condition
        node = next((c for c in d.node.clauses if isinstance(c, ast.Cel)), None)
        if cond is None or node is None or cond.variables:
            continue
        value, error = cond.evaluate_plain({})
        what = f"the condition of rule {label(d.node, d.id)}"
        if value:
            yield finding("SBP335", f"{what} is always true (it reads nothing from the call)",
                          node.span, d.node.span)
        else:
            effect = "permits nothing" if d.node.effect == "permit" else "forbids nothing"
            why = f"it always fails: {error}" if error else "it is always false"
            yield finding("SBP336", f"{what} is never true ({why}); the rule {effect}",
                          node.span, d.node.span)


def _key(d: RuleDraft) -> tuple[Any, ...]:
    # path lists compared as sets: `["/a/**", "/b/**"]` and `["/b/**", "/a/**"]` are one rule
    caps = tuple(sorted((k.value, _canonical(c).model_dump_json(by_alias=True))
                        for k, c in d.capabilities.items()))
    limits = d.limits.model_dump_json(exclude_none=True) if d.limits else None
    cond = " ".join(d.condition.source.split()) if d.condition else None
    return (d.node.effect, d.node.mandatory, caps, limits, cond)


def _canonical(c: Capability) -> Capability:
    if isinstance(c, FsCapability) and list(c.paths) != sorted(set(c.paths)):
        return c.model_copy(update={"paths": tuple(sorted(set(c.paths)))})
    return c


def check_duplicates(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP337: the same effect, capabilities, limits and condition as an earlier rule — written
    alike, or written otherwise but admitting exactly the same requests (the exact engine)."""
    first: dict[tuple[Any, ...], RuleDraft] = {}
    groups: dict[tuple[Any, ...], list[RuleDraft]] = {}
    spent = [0, 0]
    compared, stopped = 0, False  # rule pairs compared for "written otherwise" (SBP342)
    for d in view.policy.rules:
        if not d.capabilities:
            continue
        key = _key(d)
        earlier = first.setdefault(key, d)
        if earlier is not d and d.unit.file is view.file:
            yield finding("SBP337", f"rule {label(d.node, d.id)} duplicates rule "
                          f"{label(earlier.node, earlier.id)} at {earlier.node.span}",
                          head(d.node), d.node.span)
            continue
        # same effect, limits and condition, capabilities written otherwise: equal languages?
        loose = (key[0], key[1], tuple(k for k, _ in key[2]), key[3], key[4])
        group = groups.setdefault(loose, [])
        if d.unit.file is view.file and not stopped:
            if compared + len(group) > MAX_COMPARISONS:
                # a thousand rules of one shape are half a million pairs (≈ 20 s): the written-
                # alike check above goes on, the pairwise one stops and says where
                stopped = True
                yield finding("SBP342", f"SBP337 (rules written otherwise) was not checked for "
                              f"rule {label(d.node, d.id)} and the rules after it: the file "
                              f"needs more than {MAX_COMPARISONS:,} rule comparisons",
                              head(d.node), d.node.span)
                continue
            compared += len(group)
            same = next((e for e in group if _same(e, d, cfg.home, spent)), None)
            if same is not None:
                yield finding("SBP337", f"rule {label(d.node, d.id)} admits exactly what rule "
                              f"{label(same.node, same.id)} at {same.node.span} does",
                              head(d.node), d.node.span)
                continue
        group.append(d)


def _same(a: RuleDraft, b: RuleDraft, home: str, spent: list[int]) -> bool:
    """Each capability of ``a`` and ``b`` admits the other's (sound both ways)."""
    return all(k in a.capabilities and _covers(a.capabilities[k], c, home, spent)
               and _covers(c, a.capabilities[k], home, spent)
               and exact_covers(a.capabilities[k], c, home) is not False
               and exact_covers(c, a.capabilities[k], home) is not False
               for k, c in b.capabilities.items())


class _Index:
    """Rules by what a capability of theirs could cover, so a lookup tries only the rules that
    pass :func:`~policy_engine.lint.cover.fs_prefilter` (comparing every pair made `lint` take
    minutes on a policy of a few thousand rules)."""

    def __init__(self) -> None:
        self.rules: list[RuleDraft] = []
        self.keys: list[tuple[Any, ...]] = []
        self.fs: dict[tuple[CapabilityKind, tuple[str, ...]], list[int]] = {}
        self.tools: dict[tuple[CapabilityKind, str], list[int]] = {}
        self.other: dict[CapabilityKind, list[int]] = {}
        """Every rule by kind: the candidates of kinds with no finer index."""

    def add(self, d: RuleDraft, key: tuple[Any, ...]) -> None:
        n = len(self.rules)
        self.rules.append(d)
        self.keys.append(key)
        for kind, cap in d.capabilities.items():
            self.other.setdefault(kind, []).append(n)
            if isinstance(cap, FsCapability):
                for prefix in {segments(x) for x in cap.paths}:
                    self.fs.setdefault((kind, prefix), []).append(n)
            elif isinstance(cap, ProcCapability):
                self.tools.setdefault((kind, cap.tool), []).append(n)

    def candidates(self, kind: CapabilityKind, cap: Capability) -> list[int]:
        """Rules (in order) that may cover ``cap``: for fs, those with a path whose literal
        segments are a prefix of the first path's (a necessary condition of containment)."""
        if isinstance(cap, FsCapability) and cap.paths:
            segs = segments(cap.paths[0])
            found: set[int] = set()
            for k in range(len(segs) + 1):
                found.update(self.fs.get((kind, segs[:k]), ()))
            return sorted(found)
        if isinstance(cap, ProcCapability):
            return self.tools.get((kind, cap.tool), [])
        return self.other.get(kind, [])


MAX_COMPARISONS = 50_000
"""`covers` calls SBP338/SBP339 make in one file before they stop (SBP342): rules sharing a
prefix are compared pairwise, ~60 µs a pair, so this bounds the checks to a few seconds."""


class _OutOfComparisons(Exception):
    """The file used up :data:`MAX_COMPARISONS`."""


def _covered(d: RuleDraft, by: _Index, home: str, spent: list[int],
             kinds: tuple[CapabilityKind, ...] | None = None,
             skip_key: tuple[Any, ...] | None = None) -> dict[CapabilityKind, RuleDraft]:
    """For each kind of ``d``, the first rule of ``by`` covering it (rules with the key
    ``skip_key`` left out); partial when some kind is not covered. ``spent[0]`` counts the
    comparisons; :class:`_OutOfComparisons` past the budget."""
    out: dict[CapabilityKind, RuleDraft] = {}
    for kind, cap in d.capabilities.items():
        if kinds is not None and kind not in kinds:
            continue
        for n in by.candidates(kind, cap):
            other = by.rules[n]
            big = other.capabilities.get(kind)
            if skip_key is not None and by.keys[n] == skip_key:
                continue
            if big is None:
                continue
            spent[0] += 1
            if spent[0] > MAX_COMPARISONS:
                raise _OutOfComparisons
            if _covers(big, cap, home, spent):
                out[kind] = other
                break
    return out


MAX_EXACT = 2_000
"""Exact containment checks (≈ 1 ms each) one file may make where the sound approximation says
"not covered"; past it the approximation alone answers (it never claims a false cover)."""


def _covers(big: Capability, cap: Capability, home: str, spent: list[int]) -> bool:
    """``covers`` (sound, fast) first; where it says no, the exact engine decides (it finds the
    covers the approximation misses, e.g. `/--(a|b)/` under `/--.*/`) while the budget lasts."""
    if covers(big, cap, home):
        return True  # confirmed exactly before a finding is made (see _confirmed)
    if not _regex_templates(big, cap):
        return False  # elsewhere the approximation is already complete for what lint compares
    if len(spent) < 2:
        spent.append(0)
    if spent[1] >= MAX_EXACT:
        return False
    spent[1] += 1
    return exact_covers(big, cap, home) is True


def _confirmed(d: RuleDraft, by: dict[CapabilityKind, RuleDraft], home: str) -> bool:
    """The exact engine agrees with every cover found (no false "shadowed")."""
    return all(exact_covers(by[k].capabilities[k], c, home) is not False
               for k, c in d.capabilities.items())


def _regex_templates(a: Capability, b: Capability) -> bool:
    """Two templates of one tool with a regex: where `covers` compares templates only as equal
    (`/--(a|b)/` under `/--.*/` is not seen), and only the exact engine decides."""
    return (isinstance(a, ProcCapability) and isinstance(b, ProcCapability) and a.tool == b.tool
            and any(alt.regex is not None for cap in (a, b) for slot in cap.args or ()
                    for alt in slot.alternatives))


def check_shadowed(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP338 (every kind of a permit is covered by unconditional forbids) and SBP339 (by
    earlier unconditional permits, which are matched first)."""
    rules = view.policy.rules
    # a mandatory deny over fs permits is the checker's SBP216; do not say it twice
    forbids = _Index()
    for f in rules:
        if f.node.effect == "forbid" and unconditional(f.node) and not f.node.mandatory:
            forbids.add(f, ())
    earlier = _Index()
    spent = [0]
    for d in rules:
        key = _key(d)
        if (d.unit.file is view.file and d.node.effect == "permit" and d.capabilities):
            try:
                found = list(_shadowed(d, key, forbids, earlier, cfg.home, spent))
            except _OutOfComparisons:
                yield finding("SBP342", f"SBP338/SBP339 were not checked for permit "
                              f"{label(d.node, d.id)} and the rules after it: the file needs "
                              f"more than {MAX_COMPARISONS:,} rule comparisons",
                              head(d.node), d.node.span)
                return
            yield from found
        if d.node.effect == "permit" and unconditional(d.node):
            earlier.add(d, key)


def _shadowed(d: RuleDraft, key: tuple[Any, ...], forbids: _Index, earlier: _Index,
              home: str, spent: list[int]) -> Iterator[Finding]:
    by_forbid = _covered(d, forbids, home, spent, _FORBID_COVERABLE)
    if len(by_forbid) == len(d.capabilities) and _confirmed(d, by_forbid, home):
        names = ", ".join(sorted({label(f.node, f.id) for f in by_forbid.values()}))
        yield finding("SBP338", f"permit {label(d.node, d.id)} can never apply: forbid "
                      f"{names} covers all it permits", head(d.node), d.node.span)
        return
    by_permit = _covered(d, earlier, home, spent, skip_key=key)
    if len(by_permit) == len(d.capabilities) and _confirmed(d, by_permit, home):
        names = ", ".join(sorted({f"{label(e.node, e.id)} at {e.node.span}"
                                  for e in by_permit.values()}))
        yield finding("SBP339", f"permit {label(d.node, d.id)} is never the matching rule: "
                      f"earlier permit {names} admits all it does, so its limits and "
                      "condition never apply", head(d.node), d.node.span)


def check_tool_blocks(view: FileView, cfg: LintConfig) -> Iterator[Finding]:
    """SBP337-SBP339 inside a `tool` block: a permit repeating another of the block, one the
    policy's unconditional forbids cover, and one another permit of the block already admits
    (a manifest's permissions are a union, so it adds nothing). Blocks have no conditions, so
    SBP335/SBP336 cannot arise there."""
    forbids = [f for f in view.policy.rules if f.node.effect == "forbid"
               and unconditional(f.node) and not f.node.mandatory]
    views = [rv for rv in rule_views(view) if rv.tool_block is not None and rv.capabilities]
    for rv in views:
        siblings = [o for o in views if o.tool_block == rv.tool_block
                    and o.node is not rv.node and o.anchor == rv.anchor]
        caps = rv.capabilities
        same = next((o for o in siblings if o.node.span.line < rv.node.span.line
                     and _cap_key(o.capabilities) == _cap_key(caps)), None)
        if same is not None:
            yield finding("SBP337", f"{where(rv)} at line {rv.node.span.line} duplicates the "
                          f"permit at line {same.node.span.line}", head(rv.node), rv.anchor)
            continue
        by_forbid = [f for f in forbids if all(
            k in _FORBID_COVERABLE and k in f.capabilities
            and covers(f.capabilities[k], c, cfg.home) for k, c in caps.items())]
        if by_forbid:
            yield finding("SBP338", f"{where(rv)} at line {rv.node.span.line} can never "
                          f"apply: forbid {label(by_forbid[0].node, by_forbid[0].id)} covers "
                          "all it permits", head(rv.node), rv.anchor)
            continue
        wider = next((o for o in siblings if _cap_key(o.capabilities) != _cap_key(caps)
                      and all(k in o.capabilities and covers(o.capabilities[k], c, cfg.home)
                              for k, c in caps.items())), None)
        if wider is not None:
            yield finding("SBP339", f"{where(rv)} at line {rv.node.span.line} adds nothing: "
                          f"the permit at line {wider.node.span.line} admits all it does",
                          head(rv.node), rv.anchor,
                          help="delete the narrower permit: a tool's permissions are a union")


def _cap_key(caps: dict[CapabilityKind, Capability]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k.value, c.model_dump_json(by_alias=True)) for k, c in caps.items()))


CHECKS = (check_conditions, check_duplicates, check_shadowed, check_tool_blocks)
