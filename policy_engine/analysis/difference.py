"""The exact difference of two policy versions: every cell of the request universe decided by both.

Each witness of the universe (:mod:`policy_engine.analysis.dimensions`) stands for a cell of
requests every rule of either version decides alike. A cell whose matching rules are the same
in both versions (same effect, resources, limits and condition; names and order aside: deny
overrides) is decided alike by construction and skipped; every other cell is decided by both
versions with the real engine (:mod:`policy_engine.analysis.witness`). Decisions that differ are
changes; decisions that agree on an allow under rules with different limits or MIME types are
limit changes, field by field. Conditions that differ are listed as not decided, with both texts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy_engine.analysis.dimensions import Undecidable, Universe, Witness, region
from policy_engine.analysis.witness import (
    DEFAULT,
    Decider,
    Setting,
    Verdict,
    grant_for,
    manifest_for,
    op_json,
    verdict,
)
from policy_engine.errors import PolicyEngineError
from policy_engine.graph.policyset import CompiledRule, PolicySet
from policy_engine.guard.matchers import Matcher, compile_matcher
from policy_engine.guard.urls import parse_url
from policy_engine.model import (
    LIMIT_FIELDS,
    NetworkMode,
    ProcCapability,
    SafetyClass,
    SideEffect,
)
from policy_engine.patterns.hosts import HostPattern


@dataclass(frozen=True, slots=True)
class LimitChange:
    field: str
    old: object
    new: object
    stricter: str  # "old" | "new"

    def to_json(self) -> dict[str, Any]:
        def plain(v: object) -> object:
            return list(v) if isinstance(v, tuple) else v

        return {"field": self.field, "old": plain(self.old), "new": plain(self.new),
                "stricter": self.stricter}


@dataclass(slots=True)
class Change:
    """A group of witnesses decided the same way under each version; the first one is shown."""

    kind: str
    witness: Witness
    setting: Setting
    old: Verdict
    new: Verdict
    limits: tuple[LimitChange, ...] = ()
    count: int = 1

    @property
    def widening(self) -> bool:
        """Something the old version refused is allowed, or an allow got looser limits."""
        if self.old.decision != self.new.decision:
            return self.new.decision == "allow"
        return any(c.stricter == "old" for c in self.limits)

    @property
    def category(self) -> str:
        """widening | narrowing | code (a deny with another code) | limits."""
        if self.widening:
            return "widening"
        if self.old.decision != self.new.decision or self.limits:
            return "narrowing"
        return "code"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "category": self.category, "widening": self.widening,
                "setting": self.setting.label(),
                "op": op_json(self.witness.op),
                "grant": grant_for(self.witness.cap, self.setting).model_dump(
                    mode="json", exclude_none=True),
                "manifest": manifest_for(self.witness.cap, self.setting).model_dump(
                    mode="json", exclude_none=True),
                "old": self.old.to_json(), "new": self.new.to_json(),
                "limits": [c.to_json() for c in self.limits], "cells": self.count}


@dataclass(slots=True)
class Report:
    changes: list[Change] = field(default_factory=list)
    undecided: list[Undecidable] = field(default_factory=list)
    cells: int = 0
    decided: int = 0

    @property
    def exact(self) -> bool:
        return not self.undecided


# ---- which rules a cell touches -----------------------------------------------------------------


def content(rule: CompiledRule, kind: str) -> str:
    """What decides: effect, the kind's resources, limits, condition (not the name or place)."""
    cap = next(c for k, c in rule.capabilities.items() if str(k) == kind)
    return json.dumps([rule.effect, rule.mandatory, cap.model_dump(mode="json"),
                       rule.limits.model_dump(mode="json") if rule.limits else None,
                       rule.condition.source if rule.condition else None], sort_keys=True)


class Touch:
    """The rules of one version that a witness falls under (over-approximated: safe to skip on)."""

    def __init__(self, ps: PolicySet, kind: str) -> None:
        self.rules: list[tuple[str, Matcher, tuple[HostPattern, ...]]] = []
        self.schemes: list[tuple[str, frozenset[str]]] = []
        for rule in ps.rules:
            for k, cap in rule.capabilities.items():
                if str(k) != kind:
                    continue
                hosts = tuple(_host(h) for h in getattr(cap, "hosts", ()))
                self.rules.append((content(rule, kind), compile_matcher(
                    cap, kind, ps.home, forbid=rule.effect == "forbid"),
                    tuple(h for h in hosts if h is not None)))
                self.schemes.append((content(rule, kind), frozenset(
                    x.lower() for x in getattr(cap, "schemes", ()))))

    def key(self, w: Witness) -> tuple[str, ...] | None:
        """Sorted contents of the rules touching ``w``; ``None``: decide it whatever."""
        op: Any = w.op
        if w.kind in ("net.http", "browser.use"):
            try:
                url = parse_url(op.url)
            except PolicyEngineError:
                # refused before any rule is read, unless a rule names its scheme: those count
                scheme = op.url.split(":", 1)[0].lower()
                return tuple(sorted(c for c, names in self.schemes if scheme in names))
            # every rule naming the host counts: a host a rule names lifts the address refusal
            return tuple(sorted(c for c, _, hs in self.rules
                                if any(h.matches(url.host, url.ip) for h in hs)))
        if w.kind.startswith("fs."):
            res: Any = op.path
        elif w.kind == "proc.exec":
            res = (op.tool, op.args)
        else:
            res = None
        return tuple(sorted(c for c, m, _ in self.rules if res is None or m.admits(res)))


def _host(raw: str) -> HostPattern | None:
    try:
        return HostPattern.of(raw)
    except ValueError:
        return HostPattern("*", "any", "")  # a forbid's bad pattern covers everything


def profiles(ps: PolicySet) -> list[str]:
    """The named profiles, where they were written left out."""
    return sorted(repr(dataclasses.replace(p, span=None)) for p in ps.profiles.values())  # type: ignore[arg-type]


def _globals(ps: PolicySet) -> str:
    return json.dumps([ps.defaults.model_dump(mode="json"), str(ps.network), profiles(ps),
                       sorted(m.model_dump_json() for m in ps.tools.values())], sort_keys=True)


def _consent(ps: PolicySet) -> list[str]:
    return sorted(c.condition.source if c.condition else "" for c in ps.consent_rules)


def settings(old: PolicySet, new: PolicySet, kind: str) -> list[Setting]:
    """The default setting; with consent rules that differ, no consent × every manifest class;
    for network kinds, a manifest that asks for no network mode and one that asks for `on`."""
    a = sorted(c.condition.source if c.condition else "" for c in old.consent_rules)
    b = sorted(c.condition.source if c.condition else "" for c in new.consent_rules)
    out = [DEFAULT]
    if a != b:
        classes = [(s, (SideEffect.NONE,)) for s in SafetyClass] + [
            (SafetyClass.LOW, (e,)) for e in SideEffect if e is not SideEffect.NONE]
        # with consent given every consent rule is met: only its absence varies by class
        out += [Setting(False, s, e) for s, e in classes]
    if kind in ("net.http", "browser.use"):
        out += [dataclasses.replace(s, network=NetworkMode.ON) for s in out]
    return out


_BOUNDED = re.compile(r"(?:\s|request\.size|\d+|<=|>=|==|!=|<|>|&&|\|\||!|\(|\))*")
"""A condition that only compares `request.size` with integers: decided exactly."""
SIZE_KINDS = frozenset({"fs.write", "tmp.use"})


def size_cuts(source: str) -> list[int] | None:
    """The sizes at which a bounded condition can change value, or ``None``: not bounded."""
    if not _BOUNDED.fullmatch(source) or "request.size" not in source:
        return None
    return sorted({m for n in re.findall(r"\d+", source) for m in (int(n) - 1, int(n),
                                                                    int(n) + 1) if m >= 0})


def decided_sizes(old: PolicySet, new: PolicySet) -> list[int]:
    """Cuts of every bounded condition on a kind that has a size (each decided exactly)."""
    out: set[int] = set()
    for ps in (old, new):
        for r in ps.rules:
            if r.condition is not None and {str(k) for k in r.kinds} <= SIZE_KINDS:
                out |= set(size_cuts(r.condition.source) or ())
    return sorted(out)


def conditions(old: PolicySet, new: PolicySet) -> list[Undecidable]:
    """Conditions not found identically in the other version: never decided silently equal,
    except a comparison of `request.size` with integers on fs.write or tmp.use (decided at
    every cut)."""
    def conds(ps: PolicySet) -> dict[str, tuple[str, str]]:
        return {r.id: (",".join(str(k) for k in r.kinds), r.condition.source)
                for r in ps.rules if r.condition is not None}

    a, b = conds(old), conds(new)
    out = []
    for rid in sorted(set(a) | set(b)):
        if a.get(rid, ("", ""))[1] != b.get(rid, ("", ""))[1]:
            kind = (a.get(rid) or b[rid])[0]
            texts = [t for t in (a.get(rid, ("", ""))[1], b.get(rid, ("", ""))[1]) if t]
            if set(kind.split(",")) <= SIZE_KINDS and all(
                    size_cuts(t) is not None for t in texts):
                continue  # every cut of request.size is a witness size: decided exactly
            before, after = a.get(rid, ("", "(none)"))[1], b.get(rid, ("", "(none)"))[1]
            out.append(Undecidable(kind, "condition", (rid,),
                                   f"condition changed, not decided: before `{before}`, "
                                   f"after `{after}`"))
    out += _env_sets(old, new)
    if profiles(old) != profiles(new):
        out.append(Undecidable("*", "named profiles", (), (
            "named profiles changed: requests made under a named profile are not decided")))
    ca = {c.condition.source for c in old.consent_rules if c.condition}
    cb = {c.condition.source for c in new.consent_rules if c.condition}
    if ca != cb:
        out.append(Undecidable("*", "consent condition", (), (
            "consent condition changed, decided for every consent and manifest class but not "
            f"for every request: before {sorted(ca)}, after {sorted(cb)}")))
    return out


def _env_sets(old: PolicySet, new: PolicySet) -> list[Undecidable]:
    """Each single variable is decided; a set of several, split between two permits of one
    tool, is not: named when such env lists changed."""
    def lists(ps: PolicySet) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {}
        for r in ps.rules:
            cap = next((c for c in r.capabilities.values() if isinstance(c, ProcCapability)),
                       None)
            if cap is not None and cap.env is not None and r.effect == "permit":
                out.setdefault(cap.tool, []).append((r.id, repr(cap.env)))
        return out

    a, b = lists(old), lists(new)
    return [Undecidable("proc.exec", f"env of `{tool}`",
                        tuple(dict.fromkeys(i for i, _ in a.get(tool, []) + b.get(tool, []))),
                        "env allow-lists changed on a tool with several: calls setting two or "
                        "more variables are not decided")
            for tool in sorted(set(a) | set(b))
            if sorted(x for _, x in a.get(tool, [])) != sorted(x for _, x in b.get(tool, []))
            and max(len(a.get(tool, [])), len(b.get(tool, []))) > 1]


# ---- the difference ---------------------------------------------------------------------------


def changed_region(old: PolicySet, new: PolicySet) -> tuple[list[str], dict[str, str]]:
    """The kinds of the rules in one version and not the other (by content), and their region."""
    def contents(ps: PolicySet) -> Counter[tuple[str, str]]:
        return Counter((str(k), content(r, str(k))) for r in ps.rules for k in r.capabilities)

    a, b = contents(old), contents(new)
    moved = set((a - b) | (b - a))
    caps = [c for ps in (old, new) for r in ps.rules for k, c in r.capabilities.items()
            if (str(k), content(r, str(k))) in moved]
    homes = {old.home, new.home}
    focus = region(caps, old.home) if len(homes) == 1 else {}
    return sorted({k for k, _ in moved}), focus


def limit_changes(old: PolicySet, new: PolicySet, a: Verdict, b: Verdict,
                  kind: str) -> tuple[LimitChange, ...]:
    ra = next((r for r in old.rules if r.id == a.rule_id), None)
    rb = next((r for r in new.rules if r.id == b.rule_id), None)
    if ra is None or rb is None:
        return ()
    out = []
    for name in LIMIT_FIELDS:
        x = getattr(ra.limits, name) if ra.limits else None
        y = getattr(rb.limits, name) if rb.limits else None
        if x != y:  # unset means the profile's value: any set value is the stricter side
            stricter = "new" if x is None or (y is not None and y < x) else "old"
            out.append(LimitChange(name, x, y, stricter))
    ma = getattr(ra.capabilities.get(kind), "mime", ())  # type: ignore[call-overload]
    mb = getattr(rb.capabilities.get(kind), "mime", ())  # type: ignore[call-overload]
    if set(ma) != set(mb):
        stricter = "new" if ma == () or (mb and set(mb) < set(ma)) else "old"
        out.append(LimitChange("mime", tuple(ma), tuple(mb), stricter))
    return tuple(out)


def diff(old: PolicySet, new: PolicySet, *, kinds: Iterable[str] | None = None,
         focus: Mapping[str, str] | None = None) -> Report:
    """Every request class the two versions decide differently, each with a checked witness.

    :param focus: per dimension, a regex the requests compared must match (``analyze`` asks
        about one rule's region only); ``None``: the whole universe.
    """
    report = Report()
    report.undecided += conditions(old, new)
    rules = list(old.rules) + list(new.rules)
    same_globals = _globals(old) == _globals(new)
    same_consent = _consent(old) == _consent(new)
    if focus is None and kinds is None and same_globals and same_consent:
        # INVARIANT: a request no changed rule matches is matched by the same rules in both
        # versions, so it is decided alike: only the changed rules' region is walked
        kinds, focus = changed_region(old, new)
    uni = Universe(rules, [old.home, new.home], report.undecided, [old.defaults, new.defaults],
                   focus=focus, sizes=decided_sizes(old, new))
    wanted = sorted({str(k) for r in rules for k in r.capabilities} if kinds is None else kinds)
    groups: dict[tuple[object, ...], Change] = {}
    da, db = Decider(old), Decider(new)
    for kind in wanted:
        ta, tb = Touch(old, kind), Touch(new, kind)
        sets = settings(old, new, kind)
        for w in uni.witnesses(kind):
            report.cells += 1
            if same_globals:
                # consent only gates an allow: where no permit applies it cannot change anything
                ka = ta.key(w)
                if ka is not None and ka == tb.key(w) and (
                        same_consent or not any(c.startswith('["permit"') for c in ka)):
                    continue
            for setting in sets:
                _one(da, db, w, setting, report, groups)
    report.changes = list(groups.values())
    return report


def _one(da: Decider, db: Decider, w: Witness, setting: Setting, report: Report,
         groups: dict[tuple[object, ...], Change]) -> None:
    grant, manifest = grant_for(w.cap, setting), manifest_for(w.cap, setting)
    a, b = verdict(da(w.op, grant, manifest)), verdict(db(w.op, grant, manifest))
    old, new = da.ps, db.ps
    report.decided += 1
    limits: tuple[LimitChange, ...] = ()
    if a.key == b.key:
        if a.decision != "allow":
            return
        limits = limit_changes(old, new, a, b, w.kind)
        if not limits:
            return
    key = (w.kind, a.key, a.rule_id, b.key, b.rule_id, limits)  # the first setting shows
    if key in groups:
        groups[key].count += 1
    else:
        groups[key] = Change(w.kind, w, setting, a, b, limits)


def changed_kinds(report: Report) -> Sequence[str]:
    return sorted({c.kind for c in report.changes})
