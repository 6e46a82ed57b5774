"""Properties of one policy set, each answered with a proof of absence or a checked witness.

A property restricts the request universe (:mod:`policy_engine.analysis.dimensions`) to the
requests it asks about and decides every cell there with the real engine. "No" is a proof: every
cell of the restricted universe was decided and none qualified (the cells cover every request of
that shape). "Yes" comes with the witness request and the rule that decided it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from policy_engine.analysis.difference import diff
from policy_engine.analysis.dimensions import (
    Source,
    Undecidable,
    Universe,
    Witness,
    region,
    resource,
)
from policy_engine.analysis.witness import (
    DEFAULT,
    Decider,
    Setting,
    Verdict,
    describe,
    grant_for,
    manifest_for,
    op_json,
    verdict,
)
from policy_engine.graph.policyset import PolicySet
from policy_engine.guard.matchers import compile_matcher
from policy_engine.model import (
    BrowserCapability,
    Capability,
    Grant,
    Manifest,
    NetHttpCapability,
    NetworkMode,
    ProcCapability,
    ProcExecOp,
)
from policy_engine.patterns.hosts import HostPattern
from policy_engine.patterns.paths import expand_home, glob_body

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "csh", "tcsh", "ash",
                    "busybox", "env", "python", "python2", "python3", "node", "nodejs", "deno",
                    "bun", "perl", "ruby", "php", "lua", "luajit", "tclsh", "wish", "pwsh",
                    "powershell", "Rscript", "R", "julia", "osascript", "awk", "gawk", "xargs"})
"""Tools that run code given as an argument: with any arguments, any program."""
INLINE = ("-c", "-e", "--eval", "-Command", "-r", "--command")


@dataclass(slots=True)
class Answer:
    """One property's answer: ``holds`` is the concerning outcome (reachable, shadowed, …)."""

    prop: str
    question: str
    holds: bool
    detail: str
    witness: Witness | None = None
    verdict: Verdict | None = None
    classes: int = 0
    undecided: list[Undecidable] = field(default_factory=list)

    @property
    def proven(self) -> bool:
        """A witness proves itself; an absence only when every part was decided."""
        return self.witness is not None or not self.undecided

    def to_json(self) -> dict[str, Any]:
        return {"property": self.prop, "proven": self.proven, "question": self.question,
                "finding": self.holds,
                "exact": not self.undecided, "detail": self.detail, "request_classes": self.classes,
                "witness": None if self.witness is None else {
                    "op": op_json(self.witness.op),
                    "describe": describe(self.witness.op),
                    "decision": self.verdict.to_json() if self.verdict else None},
                "undecided": [{"kind": u.kind, "dimension": u.dimension, "rules": list(u.rules),
                               "reason": u.reason} for u in self.undecided]}


@dataclass(frozen=True, slots=True)
class Given:
    """The grant and manifest to decide with; ``None``: each witness gets exactly its resource."""

    grant: Grant | None = None
    manifest: Manifest | None = None

    def pair(self, cap: Capability, setting: Setting = DEFAULT) -> tuple[Grant, Manifest]:
        return (self.grant or grant_for(cap, setting), self.manifest or manifest_for(cap, setting))

    def sources(self) -> list[Source]:
        out = []
        for name, caps in (("grant", self.grant.capabilities if self.grant else ()),
                           ("manifest", self.manifest.permissions if self.manifest else ())):
            for i, cap in enumerate(caps):
                out.append(Source(f"{name}[{i}]", {cap.kind: cap}))
        return out


def _first_allowed(ps: PolicySet, ws: Iterable[Witness], given: Given,
                   setting: Setting = DEFAULT) -> tuple[Witness | None, Verdict | None, int]:
    decide = Decider(ps)
    n = 0
    for w in ws:
        n += 1
        g, m = given.pair(w.cap, setting)
        v = verdict(decide(w.op, g, m))
        if v.decision == "allow":
            return w, v, n
    return None, None, n


def can_read(ps: PolicySet, glob: str, given: Given = Given()) -> Answer:
    """Can any request read a path matching ``glob``?"""
    focus = glob_body(expand_home(glob, ps.home)).replace(".*", "[\\s\\S]*")
    und: list[Undecidable] = []
    uni = Universe([*ps.rules, *given.sources()], [ps.home], und, [ps.defaults],
                   focus={"paths": focus})
    w, v, n = _first_allowed(ps, uni.witnesses("fs.read"), given)
    q = f"can anything read a path matching `{glob}`"
    if w is not None:
        return Answer("read", q, True, f"yes: `{describe(w.op)}` is allowed by {v.rule}"  # type: ignore[union-attr]
                      , w, v, n, und)
    return Answer("read", q, False, f"no: all {n} request class(es) reading under `{glob}` "
                                    "are denied", None, None, n, und)


def can_reach(ps: PolicySet, host: str, given: Given = Given()) -> Answer:
    """Can any request (net.http or browser) reach ``host`` (a host pattern)?"""
    q = f"can anything reach host `{host}`"
    hp = HostPattern.of(host)
    focus = (re.escape(hp.value) if hp.kind == "exact" else
             r"[\s\S]*\." + re.escape(hp.value) if hp.kind == "suffix" else None)
    und: list[Undecidable] = []
    query = Source("query", {"net.http": NetHttpCapability(hosts=(host,)),
                             "browser.use": BrowserCapability(hosts=(host,))})
    uni = Universe([*ps.rules, *given.sources(), query], [ps.home], und, [ps.defaults],
                   focus={"hosts": focus} if focus else None)

    def mine() -> Iterator[Witness]:
        for kind in ("net.http", "browser.use"):
            for w in uni.witnesses(kind):
                url = getattr(w.op, "url", None) or ""
                h = url.split("://", 1)[-1].rsplit(":", 1)[0]
                if hp.kind in ("exact", "suffix") or _in_network(hp, h):
                    yield w

    # the tool asks for the network (a manifest without it is refused by `network off`)
    w, v, n = _first_allowed(ps, mine(), given, Setting(network=NetworkMode.ON))
    if w is not None:
        return Answer("reach", q, True, f"yes: `{describe(w.op)}` is allowed by {v.rule}",  # type: ignore[union-attr]
                      w, v, n, und)
    return Answer("reach", q, False, f"no: all {n} request class(es) to `{host}` are denied",
                  None, None, n, und)


def _in_network(hp: HostPattern, host: str) -> bool:
    import ipaddress

    if hp.kind == "any":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return hp.network is not None and ip.version == hp.network.version and ip in hp.network


def without(ps: PolicySet, rule_id: str) -> PolicySet:
    """``ps`` with one rule taken out (every index it sits in)."""
    def drop(rules: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(r for r in rules if r.id != rule_id)

    return dataclasses.replace(
        ps, rules=drop(ps.rules),
        permits_by_kind={k: drop(v) for k, v in ps.permits_by_kind.items()},
        forbids_by_kind={k: drop(v) for k, v in ps.forbids_by_kind.items()})


def rule_reachable(ps: PolicySet, rule_id: str) -> Answer:
    """Is rule ``rule_id`` reachable: does taking it out change any decision? (exact diff)"""
    q = f"is rule `{rule_id}` reachable (not shadowed)"
    rule = next((r for r in ps.rules if r.id == rule_id), None)
    if rule is None:
        raise KeyError(rule_id)
    # only requests the rule matches can change when it goes: the walk stays in its region
    report = diff(without(ps, rule_id), ps, kinds=[str(k) for k in rule.kinds],
                  focus=region(rule.capabilities.values(), ps.home))
    # a deny with another code only renames the refusal: the rule decides nothing there
    effective = [c for c in report.changes if c.category != "code"]
    if effective:
        c = effective[0]
        how = " with its own limits" if c.limits and c.old.decision == c.new.decision else ""
        return Answer("rule", q, False, f"yes: `{describe(c.witness.op)}` is decided "
                      f"{c.new.decision} by it{how} (without it: {c.old.decision})", c.witness,
                      c.new, report.cells, report.undecided)
    if report.undecided:
        return Answer("rule", q, True, "not decided exactly: no request found that it decides, "
                      "but part of its region could not be walked (below)", None, None,
                      report.cells, report.undecided)
    return Answer("rule", q, True, f"no: taking it out changes none of {report.cells} request "
                  "class(es): every request it matches is decided alike by other rules",
                  None, None, report.cells, report.undecided)


def grant_within(ps: PolicySet, given: Given) -> Answer:
    """Is every request the grant admits allowed by manifest ∩ policy (the grant ⊆ both)?"""
    q = "is the grant within manifest ∩ policy"
    assert given.grant is not None
    assert given.manifest is not None
    und: list[Undecidable] = []
    uni = Universe([*ps.rules, *given.sources()], [ps.home], und, [ps.defaults])
    decide = Decider(ps)
    n = 0
    for cap in given.grant.capabilities:
        m = compile_matcher(cap, cap.kind, ps.home)
        for w in uni.witnesses(cap.kind):
            res = resource(w)
            if res is None or not m.admits(res):
                continue
            n += 1
            v = verdict(decide(w.op, given.grant, given.manifest))
            if v.decision != "allow":
                return Answer("grant", q, True, f"no: the grant admits `{describe(w.op)}`, "
                              f"which is denied ({v.code})", w, v, n, und)
    return Answer("grant", q, False, f"yes: all {n} request class(es) the grant admits are "
                  "allowed", None, None, n, und)


def shell_allowed(ps: PolicySet, given: Given = Given()) -> Answer:
    """Does any permit let a shell or interpreter run with any arguments (or inline code)?"""
    q = "does any permit allow a shell or interpreter with any arguments"
    tools = sorted({c.tool for r in ps.rules if r.effect == "permit"
                    for c in r.capabilities.values() if isinstance(c, ProcCapability)
                    and PurePosixPath(c.tool).name in SHELLS})
    und: list[Undecidable] = []
    uni = Universe([*ps.rules, *given.sources()], [ps.home], und, [ps.defaults])
    decide = Decider(ps)
    n = 0
    for tool in tools:
        cells = [w for w in uni.witnesses("proc.exec")
                 if isinstance(w.op, ProcExecOp) and w.op.tool == tool and w.op.timeout_ms is None]
        allowed = []
        for w in cells:
            n += 1
            g, m = given.pair(w.cap)
            if verdict(decide(w.op, g, m)).decision == "allow":
                allowed.append(w)
        probes = [ProcExecOp(tool=tool, args=(flag, "id")) for flag in INLINE]
        for w in [Witness("proc.exec", p, cells[0].cap) for p in probes if cells] + (
                allowed if len(allowed) == len(cells) else []):
            g, m = given.pair(w.cap)
            v = verdict(decide(w.op, g, m))
            if v.decision == "allow":
                what = ("any arguments" if len(allowed) == len(cells) else "inline code")
                return Answer("shell", q, True, f"yes: `{tool}` with {what}: `{describe(w.op)}`"
                              f" is allowed by {v.rule}", w, v, n, und)
    return Answer("shell", q, False, f"no: {len(tools)} shell/interpreter tool(s) permitted "
                  f"({', '.join(tools) or 'none'}); none runs with any arguments or inline code",
                  None, None, n, und)
